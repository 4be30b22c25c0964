// Workspace: a move-only handle to memory the arena served. Eager workspaces return to the arena
// (stream-ordered on the stream they were requested on) when the handle dies. A workspace requested
// while capturing belongs to the captured graph: its range stays reserved until the graph is
// destroyed, but when the handle dies (or is reset) inside the capture, later requests of that
// capture may reuse the range -- those the graph orders after the release: on the same stream, or
// on a stream whose capture dependencies reach the releasing stream's position (an event join).
// As with any stream-ordered allocator, work on other streams that uses the workspace must be
// joined into its stream before the handle dies. A handle that dies after the capture ended
// changes nothing.
#pragma once

#include <cstdint>
#include <utility>

namespace graphsafe {

namespace detail {
class ArenaCore;
}

class Workspace {
 public:
  Workspace() = default;
  Workspace(Workspace&& o) noexcept { *this = std::move(o); }
  Workspace& operator=(Workspace&& o) noexcept {
    if (this != &o) {
      reset();
      core_ = std::exchange(o.core_, nullptr);
      block_ = std::exchange(o.block_, nullptr);
      ptr_ = std::exchange(o.ptr_, nullptr);
      bytes_ = std::exchange(o.bytes_, 0);
      count_ = std::exchange(o.count_, 0);
      stream_ = std::exchange(o.stream_, nullptr);
      captured_ = std::exchange(o.captured_, false);
    }
    return *this;
  }
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;
  ~Workspace() { reset(); }

  void* data() const noexcept { return ptr_; }
  template <class T>
  T* as() const noexcept { return static_cast<T*>(ptr_); }
  std::uint64_t bytes() const noexcept { return bytes_; }
  // Elements reserved by the policy (not the current need): lay the workspace out with this.
  std::int64_t count() const noexcept { return count_; }
  bool captured() const noexcept { return captured_; }
  explicit operator bool() const noexcept { return core_ != nullptr; }

  // Give the memory back now (stream-ordered; inside a capture, to the capture's later requests).
  // No-op for empty handles and for captured workspaces once their capture has ended (inline, so a
  // handle that was already reset or moved from costs one branch when it dies).
  void reset() noexcept {
    if (core_) release_and_clear();
  }

 private:
  friend class detail::ArenaCore;
  void release_and_clear() noexcept;
  detail::ArenaCore* core_ = nullptr;
  void* block_ = nullptr;
  void* ptr_ = nullptr;
  std::uint64_t bytes_ = 0;
  std::int64_t count_ = 0;
  void* stream_ = nullptr;
  bool captured_ = false;
};

}  // namespace graphsafe
