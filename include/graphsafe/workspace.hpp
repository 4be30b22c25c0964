// Workspace: a move-only handle to memory the arena served. Eager workspaces return to the arena
// (stream-ordered on the stream they were requested on) when the handle dies; workspaces requested
// while capturing belong to the captured graph and stay reserved until the graph is destroyed, so
// the handle dying inside the capture function is harmless.
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

  // Give the memory back now (stream-ordered). No-op for captured workspaces and empty handles
  // (inline, so a handle that was already reset or moved from costs one branch when it dies).
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
