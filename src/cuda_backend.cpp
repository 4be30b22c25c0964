#include <graphsafe/cuda_backend.hpp>
#include <graphsafe/error.hpp>

#include "environment.hpp"

#include <mutex>
#include <unordered_set>

namespace graphsafe {

void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  // The exception reports the error: clear it from the thread's last error, where the next
  // launch check of other code (PyTorch's) would find it and fail in its place.
  cudaGetLastError();
  std::string f = file;
  if (auto slash = f.find_last_of('/'); slash != std::string::npos) f = f.substr(slash + 1);
  const std::string msg = std::string("graphsafe: CUDA call failed: ") + call + " -> " + cudaGetErrorName(err) + " (" +
                          cudaGetErrorString(err) + ") at " + f + ":" + std::to_string(line);
  if (err == cudaErrorMemoryAllocation) throw out_of_memory_error(msg);
  throw cuda_error(msg, static_cast<int>(err));
}

CudaBackend::CudaBackend(CudaBackendOptions o) {
  if (o.device < 0)
    GRAPHSAFE_CUDA(cudaGetDevice(&device_));
  else
    device_ = o.device;
  cudaMemPoolProps props{};
  props.allocType = cudaMemAllocationTypePinned;
  props.handleTypes = cudaMemHandleTypeNone;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = device_;
  props.maxSize = o.pool_max_bytes;
  GRAPHSAFE_CUDA(cudaMemPoolCreate(&pool_, &props));
  std::uint64_t threshold = o.release_threshold;
  GRAPHSAFE_CUDA(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &threshold));
  GRAPHSAFE_CUDA(cudaEventCreateWithFlags(&order_event_, cudaEventDisableTiming));
  plain_ = o.plain_allocations || detail::env::plain_allocations();
}

CudaBackend::~CudaBackend() {
  for (auto& [s, ev] : pre_capture_events_) cudaEventDestroy(ev);
  if (order_event_) cudaEventDestroy(order_event_);
  if (pool_) {
    cudaDeviceSynchronize();
    cudaMemPoolDestroy(pool_);
  }
}

namespace {
// Another thread may be capturing in global mode, which makes this thread's stream-ordered
// allocation on its own (eager) stream "unsafe" and invalidates that capture. Slab allocation never
// belongs in a graph, so do it in relaxed mode (as PyTorch's allocator does).
class RelaxedMode {
 public:
  RelaxedMode() { ok_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess; }
  ~RelaxedMode() {
    if (ok_) cudaThreadExchangeStreamCaptureMode(&mode_);
  }
  RelaxedMode(const RelaxedMode&) = delete;
  RelaxedMode& operator=(const RelaxedMode&) = delete;

 private:
  cudaStreamCaptureMode mode_ = cudaStreamCaptureModeRelaxed;
  bool ok_ = false;
};
}  // namespace

void* CudaBackend::allocate_slab(std::uint64_t bytes, Stream s) {
  RelaxedMode relaxed;
  void* p = nullptr;
  if (plain_) {
    // Ordered after the stream's earlier work like a pool allocation would be: cudaMalloc is
    // synchronous, so only the later reuse needs the stream (the block keeps it as its stream).
    const cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      throw out_of_memory_error("graphsafe: cudaMalloc could not provide a slab of " + std::to_string(bytes) +
                                " bytes; reserve less or free graphs");
    }
    GRAPHSAFE_CUDA(e);
    return p;
  }
  const cudaError_t err = cudaMallocFromPoolAsync(&p, bytes, pool_, s.cuda());
  if (err == cudaErrorMemoryAllocation) {
    cudaGetLastError();
    throw out_of_memory_error("graphsafe: the CUDA pool could not provide a slab of " + std::to_string(bytes) +
                              " bytes (cudaErrorMemoryAllocation); reserve less, free graphs, or raise the pool cap");
  }
  GRAPHSAFE_CUDA(err);
  return p;
}

void CudaBackend::free_slab(void* p, std::uint64_t, Stream s) {
  RelaxedMode relaxed;
  if (plain_) {
    // Replays on `s` (any stream at teardown) may still use it.
    GRAPHSAFE_CUDA(s.cuda() ? cudaStreamSynchronize(s.cuda()) : cudaDeviceSynchronize());
    GRAPHSAFE_CUDA(cudaFree(p));
    return;
  }
  if (!s.cuda()) {
    // Arena teardown: replays may still run on non-blocking streams the legacy stream does not
    // order against. Wait for the device, then free.
    GRAPHSAFE_CUDA(cudaDeviceSynchronize());
    GRAPHSAFE_CUDA(cudaFree(p));
    return;
  }
  GRAPHSAFE_CUDA(cudaFreeAsync(p, s.cuda()));
}

CaptureInfo CudaBackend::capture_info(Stream s) const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
  GRAPHSAFE_CUDA(cudaStreamGetCaptureInfo(s.cuda(), &status, &id));
  return {status == cudaStreamCaptureStatusActive, id, status == cudaStreamCaptureStatusInvalidated};
}

void CudaBackend::begin_capture(Stream s, CaptureMode mode) {
  if (!s.cuda())
    throw invalid_argument_error("graphsafe: cannot capture the legacy default stream (stream 0); create a stream "
                                 "with cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking)");
  const cudaStreamCaptureMode m = mode == CaptureMode::global           ? cudaStreamCaptureModeGlobal
                                  : mode == CaptureMode::thread_local_mode ? cudaStreamCaptureModeThreadLocal
                                                                           : cudaStreamCaptureModeRelaxed;
  cudaEvent_t ev = nullptr;
  GRAPHSAFE_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
  // Under the mutex order_after holds while it records on a producer stream: a capture cannot
  // begin between its "is it capturing?" check and its event record (which would join the capture).
  std::lock_guard g(capture_events_mutex_);
  if (const cudaError_t e = cudaEventRecord(ev, s.cuda()); e != cudaSuccess) {
    cudaEventDestroy(ev);
    GRAPHSAFE_CUDA(e);
  }
  if (auto it = pre_capture_events_.find(s.cuda()); it != pre_capture_events_.end()) cudaEventDestroy(it->second);
  pre_capture_events_[s.cuda()] = ev;
  if (const cudaError_t e = cudaStreamBeginCapture(s.cuda(), m); e != cudaSuccess) {
    cudaEventDestroy(ev);
    pre_capture_events_.erase(s.cuda());
    GRAPHSAFE_CUDA(e);
  }
}

namespace {
void drop_event(std::mutex& m, std::unordered_map<cudaStream_t, cudaEvent_t>& events, cudaStream_t s) noexcept {
  std::lock_guard g(m);
  if (auto it = events.find(s); it != events.end()) {
    cudaEventDestroy(it->second);
    events.erase(it);
  }
}
}  // namespace

GraphHandle CudaBackend::end_capture(Stream s) {
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(s.cuda(), &graph);
  // Dropped only once the stream no longer captures: order_after may need it until then.
  drop_event(capture_events_mutex_, pre_capture_events_, s.cuda());
  GRAPHSAFE_CUDA(end);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, graph, 0);
  if (err != cudaSuccess) {
    cudaGraphDestroy(graph);
    GRAPHSAFE_CUDA(err);
  }
  return {graph, exec};
}

void CudaBackend::abort_capture(Stream s) noexcept {
  cudaGraph_t graph = nullptr;
  if (cudaStreamEndCapture(s.cuda(), &graph) == cudaSuccess && graph) cudaGraphDestroy(graph);
  drop_event(capture_events_mutex_, pre_capture_events_, s.cuda());
  cudaGetLastError();  // the capture's own error was already reported to the caller
}

bool CudaBackend::capture_dependencies(Stream s, std::vector<const void*>& out) const {
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  const cudaGraphNode_t* deps = nullptr;
  std::size_t n = 0;
  if (cudaStreamGetCaptureInfo(s.cuda(), &status, nullptr, nullptr, &deps, nullptr, &n) != cudaSuccess ||
      status != cudaStreamCaptureStatusActive) {
    cudaGetLastError();
    return false;
  }
  out.assign(deps, deps + n);
  return true;
}

bool CudaBackend::capture_ordered_after(Stream s, const std::vector<const void*>& before) const {
  if (before.empty()) return true;
  std::vector<const void*> frontier;
  if (!capture_dependencies(s, frontier)) return false;
  // Walk the capture's graph backwards from the stream's dependencies until every node of
  // `before` is found (reachability through cudaGraphNodeGetDependencies).
  std::unordered_set<const void*> left(before.begin(), before.end());
  std::unordered_set<const void*> seen;
  std::vector<cudaGraphNode_t> preds;
  while (!frontier.empty() && !left.empty()) {
    const void* n = frontier.back();
    frontier.pop_back();
    if (!seen.insert(n).second) continue;
    left.erase(n);
    auto node = static_cast<cudaGraphNode_t>(const_cast<void*>(n));
    std::size_t count = 0;
    if (cudaGraphNodeGetDependencies(node, nullptr, nullptr, &count) != cudaSuccess) {
      cudaGetLastError();
      return false;  // cannot tell: unproven
    }
    preds.resize(count);
    if (count && cudaGraphNodeGetDependencies(node, preds.data(), nullptr, &count) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    for (std::size_t i = 0; i < count; ++i) frontier.push_back(preds[i]);
  }
  return left.empty();
}

bool CudaBackend::graph_topology(const GraphHandle& g, GraphTopology& out) const {
  auto graph = static_cast<cudaGraph_t>(g.graph);
  if (!graph) return false;
  std::size_t n = 0, e = 0;
  if (cudaGraphGetNodes(graph, nullptr, &n) != cudaSuccess || cudaGraphGetEdges(graph, nullptr, nullptr, nullptr, &e) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  std::vector<cudaGraphNode_t> nodes(n), from(e), to(e);
  // Edge data is asked for too: without it, edges that carry some (programmatic launches) fail the query.
  std::vector<cudaGraphEdgeData> data(e);
  if ((n && cudaGraphGetNodes(graph, nodes.data(), &n) != cudaSuccess) ||
      (e && cudaGraphGetEdges(graph, from.data(), to.data(), data.data(), &e) != cudaSuccess)) {
    cudaGetLastError();
    return false;
  }
  out.nodes.assign(nodes.begin(), nodes.begin() + static_cast<std::ptrdiff_t>(n));
  out.edges.clear();
  for (std::size_t i = 0; i < e; ++i) out.edges.emplace_back(from[i], to[i]);
  return true;
}

void CudaBackend::launch(const GraphHandle& g, Stream s) {
  GRAPHSAFE_CUDA(cudaGraphLaunch(static_cast<cudaGraphExec_t>(g.exec), s.cuda()));
}

void CudaBackend::destroy(GraphHandle& g) noexcept {
  // A graph may die while this thread captures another (Python drops the old graph when
  // `with arena.capture(b) as cap:` rebinds `cap`): in global mode the destroy would invalidate
  // that capture.
  RelaxedMode relaxed;
  if (g.exec) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(g.exec));
  if (g.graph) cudaGraphDestroy(static_cast<cudaGraph_t>(g.graph));
  g = {};
}

void CudaBackend::order_after(Stream waiter, Stream producer) {
  // One critical section with begin_capture (which records the pre-capture event and begins the
  // capture under this mutex), so `producer` cannot start capturing between the check and the
  // record below -- recording on a capturing stream would fork `waiter` into that capture.
  std::lock_guard g(capture_events_mutex_);
  if (auto it = pre_capture_events_.find(producer.cuda()); it != pre_capture_events_.end()) {
    // Capturing through graphsafe: what was released on it was released before the capture began.
    GRAPHSAFE_CUDA(cudaStreamWaitEvent(waiter.cuda(), it->second, 0));
    return;
  }
  if (capture_info(producer).active)
    throw capture_state_error("graphsafe: memory last used on a stream that is capturing outside graphsafe; "
                              "capture through graphsafe::capture so its earlier work can be ordered");
  GRAPHSAFE_CUDA(cudaEventRecord(order_event_, producer.cuda()));
  GRAPHSAFE_CUDA(cudaStreamWaitEvent(waiter.cuda(), order_event_, 0));
}

void CudaBackend::synchronize(Stream s) { GRAPHSAFE_CUDA(cudaStreamSynchronize(s.cuda())); }

}  // namespace graphsafe

namespace graphsafe {

void CudaBackend::fill_bytes(void* p, std::uint64_t bytes, std::uint8_t value, Stream s) {
  if (bytes) GRAPHSAFE_CUDA(cudaMemsetAsync(p, value, bytes, s.cuda()));
}

void CudaBackend::copy_to_host(void* dst, const void* src, std::uint64_t bytes, Stream s) {
  if (bytes) GRAPHSAFE_CUDA(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s.cuda()));
}

}  // namespace graphsafe
