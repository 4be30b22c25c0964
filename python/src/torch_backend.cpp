// TorchCudaBackend: the CUDA backend with capture through torch.cuda.CUDAGraph.
//
// Slabs, stream ordering, fills and copies are CudaBackend's (a private cudaMemPool_t). Captures
// begin and end through torch's CUDAGraph.capture_begin / capture_end, so PyTorch knows about them:
// tensors torch allocates inside an arena capture come from the graph's private pool (as under
// torch.cuda.graph) instead of breaking the capture, while graphsafe's workspaces, plans and guards
// work as on the CUDA backend. Replays launch the torch graph on the replay stream. Capture state
// (capture_info) is read from CUDA, which sees torch's capture like any other.
#include "common.hpp"

#include <nanobind/stl/optional.h>

#include <cuda_runtime_api.h>

#include <mutex>
#include <unordered_map>

namespace graphsafe::python {
namespace {

using namespace nb::literals;

class TorchCudaBackend final : public Backend {
 public:
  TorchCudaBackend(CudaBackendOptions o, nb::object pool) : inner_(o), pool_(std::move(pool)) {
    torch_ = nb::module_::import_("torch");
  }
  ~TorchCudaBackend() override {
    for (auto& [stream, ev] : pre_capture_) cudaEventDestroy(ev);
    nb::gil_scoped_acquire gil;
    pending_.clear();
    pool_ = nb::object();
    torch_ = nb::object();
  }

  std::string_view name() const override { return "torch-cuda"; }
  bool nvtx_heaps_supported() const override { return inner_.nvtx_heaps_supported(); }
  void* allocate_slab(std::uint64_t bytes, Stream s) override { return inner_.allocate_slab(bytes, s); }
  void free_slab(void* p, std::uint64_t bytes, Stream s) override { inner_.free_slab(p, bytes, s); }
  CaptureInfo capture_info(Stream s) const override { return inner_.capture_info(s); }
  // As CudaBackend: work released on a stream before its capture began is ordered through the event
  // recorded then (recording on the capturing stream would fork `waiter` into the capture).
  void order_after(Stream waiter, Stream producer) override {
    {
      std::lock_guard lock(events_mutex_);
      if (auto it = pre_capture_.find(producer.handle()); it != pre_capture_.end()) {
        GRAPHSAFE_CUDA(cudaStreamWaitEvent(waiter.cuda(), it->second, 0));
        return;
      }
    }
    inner_.order_after(waiter, producer);
  }
  void synchronize(Stream s) override { inner_.synchronize(s); }
  void fill_bytes(void* p, std::uint64_t bytes, std::uint8_t value, Stream s) override {
    inner_.fill_bytes(p, bytes, value, s);
  }
  void copy_to_host(void* dst, const void* src, std::uint64_t bytes, Stream s) override {
    inner_.copy_to_host(dst, src, bytes, s);
  }

  void begin_capture(Stream s, CaptureMode mode) override {
    if (!s.cuda())
      throw invalid_argument_error("graphsafe: cannot capture the legacy default stream (stream 0); use a "
                                   "torch.cuda.Stream (with torch.cuda.stream(s): ...)");
    nb::gil_scoped_acquire gil;
    nb::object g = torch_.attr("cuda").attr("CUDAGraph")();
    cudaEvent_t ev = nullptr;
    GRAPHSAFE_CUDA(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    // The event is published before the capture begins (and outside the lock: torch runs Python
    // there), so order_after never records on a stream that began capturing after its check.
    {
      std::lock_guard lock(events_mutex_);
      if (const cudaError_t e = cudaEventRecord(ev, s.cuda()); e != cudaSuccess) {
        cudaEventDestroy(ev);
        GRAPHSAFE_CUDA(e);
      }
      if (auto it = pre_capture_.find(s.handle()); it != pre_capture_.end()) cudaEventDestroy(it->second);
      pre_capture_[s.handle()] = ev;
    }
    nb::object pool = pool_;
    try {
      if (graphsafe_pool()) {
        // A pool of its own for each capture, over the arena: its segments are the capture's opaque
        // requests, the graph's while it lives (the CUDAGraph object keeps the pool).
        if (!torch_allocator_serves(*this))
          throw capture_state_error("graphsafe: TorchCudaBackend(pool='graphsafe') captures into the arena's torch "
                                    "allocator, but no arena on this backend serves it; call "
                                    "graphsafe.torch_mem_pool(arena) once before capturing");
        nb::object mp = nb::module_::import_("graphsafe._torch_allocator").attr("_capture_pool")(inner_.device());
        g.attr("_graphsafe_pool") = mp;
        pool = mp.attr("id");
      }
      on_stream(s, [&] { g.attr("capture_begin")("pool"_a = pool, "capture_error_mode"_a = mode_name(mode)); });
    } catch (...) {
      drop_event(s);
      throw;
    }
    std::lock_guard lock(events_mutex_);
    pending_[s.handle()] = std::move(g);
  }

  GraphHandle end_capture(Stream s) override {
    nb::gil_scoped_acquire gil;
    nb::object g = take(s);
    if (!g.is_valid()) throw capture_state_error("graphsafe: no torch capture under way on this stream");
    try {
      on_stream(s, [&] { g.attr("capture_end")(); });
    } catch (...) {
      drop_event(s);
      throw;
    }
    drop_event(s);
    return GraphHandle{g.release().ptr(), nullptr};
  }

  void abort_capture(Stream s) noexcept override {
    nb::gil_scoped_acquire gil;
    try {
      nb::object g = take(s);
      if (g.is_valid()) on_stream(s, [&] { g.attr("capture_end")(); });
    } catch (nb::python_error& e) {
      // An invalidated capture cannot end cleanly; the error that invalidated it is the caller's.
      e.restore();
      PyErr_Clear();
    } catch (...) {
    }
    drop_event(s);
    cudaGetLastError();
  }

  void launch(const GraphHandle& h, Stream s) override {
    nb::gil_scoped_acquire gil;
    nb::handle g(static_cast<PyObject*>(h.graph));
    on_stream(s, [&] { g.attr("replay")(); });
  }

  void destroy(GraphHandle& h) noexcept override {
    if (!h.graph) return;
    nb::gil_scoped_acquire gil;
    // As CudaBackend::destroy: the torch graph may die while this thread captures another (Python
    // drops the old graph when `with arena.capture(b) as cap:` rebinds `cap`), and its
    // cudaGraphExecDestroy would invalidate that capture in global mode.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    const bool exchanged = cudaThreadExchangeStreamCaptureMode(&mode) == cudaSuccess;
    Py_DECREF(static_cast<PyObject*>(h.graph));
    if (exchanged) cudaThreadExchangeStreamCaptureMode(&mode);
    h.graph = nullptr;
  }

  int device() const { return inner_.device(); }
  bool graphsafe_pool() const { return nb::isinstance<nb::str>(pool_) && nb::cast<std::string>(pool_) == "graphsafe"; }

 private:
  static const char* mode_name(CaptureMode m) {
    switch (m) {
      case CaptureMode::global: return "global";
      case CaptureMode::thread_local_mode: return "thread_local";
      case CaptureMode::relaxed: return "relaxed";
    }
    return "global";
  }

  void drop_event(Stream s) noexcept {
    std::lock_guard lock(events_mutex_);
    if (auto it = pre_capture_.find(s.handle()); it != pre_capture_.end()) {
      cudaEventDestroy(it->second);
      pre_capture_.erase(it);
    }
  }

  nb::object take(Stream s) {
    std::lock_guard lock(events_mutex_);
    auto it = pending_.find(s.handle());
    if (it == pending_.end()) return nb::object();
    nb::object g = std::move(it->second);
    pending_.erase(it);
    return g;
  }

  // Run `fn` with torch's current stream set to `s` (CUDAGraph captures and replays on it).
  template <class Fn>
  void on_stream(Stream s, Fn&& fn) {
    nb::object cuda = torch_.attr("cuda");
    nb::object ext = cuda.attr("ExternalStream")(reinterpret_cast<std::uintptr_t>(s.handle()), "device"_a = inner_.device());
    nb::object ctx = cuda.attr("stream")(ext);
    ctx.attr("__enter__")();
    try {
      fn();
    } catch (...) {
      ctx.attr("__exit__")(nb::none(), nb::none(), nb::none());
      throw;
    }
    ctx.attr("__exit__")(nb::none(), nb::none(), nb::none());
  }

  CudaBackend inner_;
  nb::object pool_;
  nb::object torch_;
  std::mutex events_mutex_;
  std::unordered_map<void*, nb::object> pending_;      // stream -> CUDAGraph being captured
  std::unordered_map<void*, cudaEvent_t> pre_capture_;  // stream -> event recorded before its capture
};

}  // namespace

int cuda_device_of(const Backend& backend) {
  if (backend.name() == "cuda") return static_cast<const CudaBackend&>(backend).device();
  if (backend.name() == "torch-cuda") return static_cast<const TorchCudaBackend&>(backend).device();
  return -1;
}

void bind_torch_backend(nb::module_& m) {
  nb::class_<TorchCudaBackend, Backend>(
      m, "TorchCudaBackend",
      "The CUDA backend capturing through torch.cuda.CUDAGraph: torch may allocate inside an arena capture "
      "(from the graph's private pool, or `pool`, a torch.cuda.graph_pool_handle() shared by graphs replayed "
      "one at a time, or 'graphsafe': a pool per capture over the arena's torch allocator, see torch_mem_pool); "
      "graphsafe's workspaces and guards work as on CudaBackend. Imports torch.")
      .def("__init__",
           [](TorchCudaBackend* self, int device, nb::object pool, std::optional<std::uint64_t> release_threshold) {
             CudaBackendOptions o;
             o.device = device;
             if (release_threshold) o.release_threshold = *release_threshold;
             new (self) TorchCudaBackend(o, std::move(pool));
           },
           "device"_a = -1, nb::arg("pool").none() = nb::none(), nb::arg("release_threshold").none() = nb::none())
      .def_prop_ro("device", &TorchCudaBackend::device);
}

}  // namespace graphsafe::python
