#include <graphsafe/error.hpp>
#include <graphsafe/host_backend.hpp>

#include <atomic>
#include <cstdlib>
#include <cstring>

namespace graphsafe {

Stream::Stream(HostStream& s) : handle_(static_cast<void*>(&s)) {}

void HostStream::launch(std::function<void()> work) {
  if (recording_)
    recording_->push_back(std::move(work));
  else
    work();
}

namespace {
HostStream& host(Stream s) {
  if (!s.handle())
    throw invalid_argument_error("graphsafe: the host backend got a null stream; pass a graphsafe::HostStream");
  return *static_cast<HostStream*>(s.handle());
}
std::atomic<std::uint64_t> next_capture_id{1};
struct HostGraph {
  std::vector<std::function<void()>> work;
};
}  // namespace

void* HostBackend::allocate_slab(std::uint64_t bytes, Stream) {
  // Claim the bytes against the limit first (atomically: concurrent growth must not overshoot it).
  std::uint64_t used = in_use_.load();
  do {
    if (opts_.limit_bytes && (bytes > opts_.limit_bytes || used > opts_.limit_bytes - bytes))
      throw out_of_memory_error("graphsafe: host backend cannot allocate a slab of " + std::to_string(bytes) +
                                " bytes: " + std::to_string(used) + " of its " + std::to_string(opts_.limit_bytes) +
                                "-byte limit are in use; reserve less or raise HostBackendOptions::limit_bytes");
  } while (!in_use_.compare_exchange_weak(used, used + bytes));
  const std::uint64_t rounded = (bytes + 4095) / 4096 * 4096;
  void* p = rounded >= bytes ? std::aligned_alloc(4096, rounded) : nullptr;
  if (!p) {
    in_use_ -= bytes;
    throw out_of_memory_error("graphsafe: host allocation of " + std::to_string(bytes) + " bytes failed");
  }
  std::memset(p, 0xA5, rounded);  // never hand out zeros: they hide unwritten memory in tests
  ++slab_allocations_;
  return p;
}

void HostBackend::free_slab(void* p, std::uint64_t bytes, Stream) {
  std::free(p);
  in_use_ -= bytes;
}

CaptureInfo HostBackend::capture_info(Stream s) const {
  const HostStream& h = host(s);
  return {h.capture_id_ != 0, h.capture_id_, false};
}

void HostBackend::begin_capture(Stream s, CaptureMode) {
  HostStream& h = host(s);
  if (h.capture_id_)
    throw capture_state_error("graphsafe: host stream is already capturing (capture id " + std::to_string(h.capture_id_) +
                              "); end that capture first");
  h.capture_id_ = next_capture_id.fetch_add(1);
  h.recording_ = &(new HostGraph)->work;
}

GraphHandle HostBackend::end_capture(Stream s) {
  HostStream& h = host(s);
  if (!h.capture_id_) throw capture_state_error("graphsafe: end_capture on a host stream that is not capturing");
  // recording_ points at the first member of a HostGraph.
  auto* g = reinterpret_cast<HostGraph*>(h.recording_);
  h.capture_id_ = 0;
  h.recording_ = nullptr;
  return {g, g};
}

void HostBackend::abort_capture(Stream s) noexcept {
  HostStream& h = *static_cast<HostStream*>(s.handle());
  delete reinterpret_cast<HostGraph*>(h.recording_);
  h.capture_id_ = 0;
  h.recording_ = nullptr;
}

void HostBackend::launch(const GraphHandle& g, Stream s) {
  HostStream& h = host(s);
  auto* graph = static_cast<HostGraph*>(g.exec);
  if (h.recording_) {
    h.recording_->push_back([graph] {
      for (auto& w : graph->work) w();
    });
    return;
  }
  for (auto& w : graph->work) w();
}

void HostBackend::destroy(GraphHandle& g) noexcept {
  delete static_cast<HostGraph*>(g.exec);
  g = {};
}

}  // namespace graphsafe

namespace graphsafe {

// Host streams run eagerly (debug operations happen outside capture), so these are immediate.
void HostBackend::fill_bytes(void* p, std::uint64_t bytes, std::uint8_t value, Stream) {
  if (bytes) std::memset(p, value, bytes);
}

void HostBackend::copy_to_host(void* dst, const void* src, std::uint64_t bytes, Stream) {
  if (bytes) std::memcpy(dst, src, bytes);
}

}  // namespace graphsafe
