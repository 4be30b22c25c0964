// graphsafe_cupti: CUPTI runtime + driver API callbacks that flag capture-unsafe calls made by any
// code in the process while a stream is capturing. See include/graphsafe/cupti.hpp and
// docs/cupti_injection.md.
//
// Layout of the callback:
//   * Runtime API callbacks are enabled for the whole domain: ENTER/EXIT keep a per-thread depth, so
//     the driver calls a runtime function makes (cudaMalloc -> cuMemAlloc_v2) are not reported twice.
//     Driver callbacks are enabled only for the calls we look at and count only at depth 0 (code that
//     calls the driver directly: Triton, PyTorch's expandable segments, ctypes).
//   * Captures are tracked from BeginCapture/EndCapture (all variants); a call's own stream is also
//     queried (cuStreamGetCaptureInfo), which catches streams forked into a capture.
//   * Our own driver calls from inside a callback run with t_in_tool set and are ignored.
#include <graphsafe/cupti.hpp>

#include "frames.hpp"

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <cupti.h>  // includes generated_cuda_meta.h / generated_cuda_runtime_api_meta.h (no include guards)

#include <dlfcn.h>
#include <execinfo.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace graphsafe::cupti {
namespace {

// ---- per-thread state ---------------------------------------------------------------------------

thread_local int t_rt_depth = 0;         // runtime API nesting (ENTER..EXIT)
thread_local bool t_in_tool = false;     // our own CUDA calls: ignore their callbacks
thread_local int t_interaction_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;  // cudaThreadExchangeStreamCaptureMode
thread_local int t_pending_mode = -1;    // requested mode between ENTER and EXIT of the exchange

struct InTool {
  bool prev;
  InTool() : prev(t_in_tool) { t_in_tool = true; }
  ~InTool() { t_in_tool = prev; }
};

long tid() { return static_cast<long>(::syscall(SYS_gettid)); }

// ---- global state (heap, never destroyed: callbacks may arrive during process teardown) --------

struct Capture {
  std::uintptr_t key = 0;     // stream key
  std::uintptr_t stream = 0;  // stream handle as passed
  int mode = 0;
  std::uint64_t id = 0;
  long thread = 0;
  std::vector<std::size_t> findings;  // indices into State::findings
};

struct LaunchRec {
  std::uintptr_t key = 0;
  std::uint64_t seq = 0;
  long thread = 0;
};

struct State {
  std::mutex mu;
  CUpti_SubscriberHandle subscriber = nullptr;
  bool enabled = false;
  bool atexit_registered = false;
  std::atomic<bool> exiting{false};
  std::atomic<int> active_captures{0};
  std::map<std::uintptr_t, Capture> captures;  // by stream key
  std::vector<Finding> findings;
  std::vector<bool> printed;
  std::map<std::string, std::size_t> dedup;
  std::uint64_t captures_seen = 0;
  // graph launch ordering
  std::unordered_map<std::uintptr_t, std::uint64_t> seq;     // launches issued per stream key
  std::unordered_map<std::uintptr_t, std::uint64_t> synced;  // launches known complete per stream key
  std::map<std::pair<std::uintptr_t, std::uintptr_t>, std::uint64_t> waited;  // (waiter, producer) -> seq
  std::unordered_map<void*, std::pair<std::uintptr_t, std::uint64_t>> events;  // event -> (stream key, seq)
  std::unordered_map<void*, LaunchRec> execs;
};

State& st() {
  static State* s = new State;
  return *s;
}

const char* mode_name(int m) {
  switch (m) {
    case CU_STREAM_CAPTURE_MODE_GLOBAL: return "global";
    case CU_STREAM_CAPTURE_MODE_THREAD_LOCAL: return "thread_local";
    case CU_STREAM_CAPTURE_MODE_RELAXED: return "relaxed";
    default: return "unknown";
  }
}

// Streams: 0 is the legacy stream for plain API versions and the per-thread stream for _ptsz ones;
// per-thread streams are keyed per thread.
constexpr std::uintptr_t kLegacy = 0x1, kPerThread = 0x2;
std::uintptr_t normalize(std::uintptr_t s, bool ptsz) {
  if (s == 0) return ptsz ? kPerThread : kLegacy;
  return s;
}
std::uintptr_t key_of(std::uintptr_t s) {  // s normalized
  if (s == kPerThread) return (static_cast<std::uintptr_t>(tid()) << 8) | kPerThread;
  return s;
}

struct CaptureQuery {
  bool active = false;
  std::uint64_t id = 0;
};
CaptureQuery query_capture(std::uintptr_t s /*normalized*/) {
  // Never query the legacy stream: with a blocking stream capturing, that is an implicit-sync error.
  if (s == kLegacy) return {};
  InTool guard;
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  cuuint64_t id = 0;
  if (cuStreamGetCaptureInfo(reinterpret_cast<CUstream>(s), &status, &id, nullptr, nullptr, nullptr, nullptr) !=
      CUDA_SUCCESS)
    return {};
  return {status == CU_STREAM_CAPTURE_STATUS_ACTIVE, static_cast<std::uint64_t>(id)};
}

bool is_device_pointer(const void* p) {
  if (!p) return false;
  InTool guard;
  unsigned int type = 0;
  if (cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, reinterpret_cast<CUdeviceptr>(p)) != CUDA_SUCCESS)
    return false;
  return type == CU_MEMORYTYPE_DEVICE;
}

// ---- backtraces ---------------------------------------------------------------------------------

void* self_base() {
  static void* base = [] {
    Dl_info info{};
    dladdr(reinterpret_cast<void*>(&self_base), &info);
    return info.dli_fbase;
  }();
  return base;
}

// Symbolized frames of the caller from its call site outwards (frames.hpp): the frames of the CUDA
// runtime (shared, or static inside the program), the driver, CUPTI and this library are dropped,
// so the first entry is the program's own call and keys the finding. `api` is the function the
// callback is for.
std::vector<std::string> caller_backtrace(const char* api) {
  void* pcs[64];
  const int n = ::backtrace(pcs, 64);
  const std::vector<detail::Frame> frames = detail::symbolize(pcs, n);
  std::vector<std::string> out;
  for (std::size_t i = detail::first_outside_runtime(frames, api ? api : "", self_base());
       i < frames.size() && out.size() < 24; ++i)
    out.push_back(frames[i].describe());
  return out;
}

// ---- findings -----------------------------------------------------------------------------------

std::string hex(std::uintptr_t v) {
  char b[32];
  std::snprintf(b, sizeof b, "0x%" PRIxPTR, v);
  return b;
}

void print_finding(const Finding& f) {
  std::string where;
  if (f.capture_id)
    where = " during capture " + std::to_string(f.capture_id) + " (stream " + hex(f.capture_stream) + ", mode " +
            f.capture_mode + ", begun on thread " + std::to_string(f.capture_thread) + ")";
  std::fprintf(stderr, "graphsafe-cupti: [%s] %s: %s%s%s on thread %ld%s%s\n    %s\n", f.severity.c_str(),
               f.kind.c_str(), f.api.c_str(), f.bytes ? (" (" + std::to_string(f.bytes) + " B)").c_str() : "",
               f.stream ? (" on stream " + hex(f.stream) + (f.on_capturing_stream ? " (capturing)" : "")).c_str() : "",
               f.thread, where.c_str(), f.count > 1 ? (" [x" + std::to_string(f.count) + "]").c_str() : "",
               f.reason.c_str());
  std::size_t shown = 0;
  for (const auto& fr : f.backtrace) {
    std::fprintf(stderr, "      at %s\n", fr.c_str());
    if (++shown == 8) break;
  }
}

// graphsafe's in-process debug report (include/graphsafe/debug.hpp), when the program has it and
// exports it (ENABLE_EXPORTS / -rdynamic): graphsafe::debug::report_finding(kind, site, message, fix,
// request, graph). Looked up by name so the library stays usable in programs without graphsafe.
using DebugHook = void (*)(std::string_view, std::string_view, std::string_view, std::string_view, std::string_view,
                           std::string_view);
DebugHook debug_hook() {
  static DebugHook h = reinterpret_cast<DebugHook>(dlsym(
      RTLD_DEFAULT, "_ZN9graphsafe5debug14report_findingESt17basic_string_viewIcSt11char_traitsIcEES4_S4_S4_S4_S4_"));
  return h;
}

// Record (or merge) a finding; caller holds st().mu. Returns the index.
std::size_t add_finding_locked(Finding f, Capture* cap, bool print_now) {
  State& s = st();
  std::string key = f.severity + '|' + f.kind + '|' + f.api + '|' + f.site + '|' + std::to_string(f.capture_id);
  if (auto it = s.dedup.find(key); it != s.dedup.end()) {
    s.findings[it->second].count++;
    return it->second;
  }
  if (DebugHook h = debug_hook(); h && f.kind != "host-value" && f.kind != "guard-failure" && f.kind != "exception") {
    // One report for everything: CUPTI findings also go to graphsafe's debug report (external kinds).
    InTool guard;
    const std::string k = "cupti-" + f.kind, what = f.api + " during capture";
    h(k, f.site, what + ": " + f.reason, {}, f.api, {});
  }
  s.findings.push_back(std::move(f));
  s.printed.push_back(false);
  const std::size_t idx = s.findings.size() - 1;
  s.dedup.emplace(std::move(key), idx);
  if (cap) cap->findings.push_back(idx);
  if (print_now) {
    print_finding(s.findings[idx]);
    s.printed[idx] = true;
  }
  return idx;
}

// ---- decoded calls ------------------------------------------------------------------------------

enum class Op {
  none,
  alloc,
  free_,
  alloc_async,
  free_async,
  sync_device,
  sync_stream,
  sync_event,
  query_stream,
  query_event,
  d2h_sync,   // synchronous device-to-host copy
  d2h_async,  // stream-ordered device-to-host copy
  memcpy_maybe_d2h_sync,
  memcpy_maybe_d2h_async,
  begin_capture,
  end_capture,
  graph_launch,
  event_record,
  stream_wait_event,
  exchange_mode,
  exec_destroy,
  event_destroy,
};

struct Call {
  Op op = Op::none;
  bool has_stream = false;
  bool ptsz = false;
  std::uintptr_t stream = 0;  // raw argument
  std::uint64_t bytes = 0;
  int mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  void* event = nullptr;
  void* exec = nullptr;
  int* mode_ptr = nullptr;
  const void* dst = nullptr;
  const void* src = nullptr;
};

template <class P>
const P& prm(const CUpti_CallbackData* cb) {
  return *static_cast<const P*>(cb->functionParams);
}
template <class T>
std::uintptr_t u(T* p) {
  return reinterpret_cast<std::uintptr_t>(p);
}

Op kind_op(cudaMemcpyKind k, bool async) {
  if (k == cudaMemcpyDeviceToHost) return async ? Op::d2h_async : Op::d2h_sync;
  if (k == cudaMemcpyDefault) return async ? Op::memcpy_maybe_d2h_async : Op::memcpy_maybe_d2h_sync;
  return Op::none;
}

Call decode_runtime(CUpti_CallbackId id, const CUpti_CallbackData* cb) {
  Call c;
#define RT(name) CUPTI_RUNTIME_TRACE_CBID_##name
  switch (id) {
    case RT(cudaMalloc_v3020): c.op = Op::alloc; c.bytes = prm<cudaMalloc_v3020_params>(cb).size; break;
    case RT(cudaMallocHost_v3020): c.op = Op::alloc; c.bytes = prm<cudaMallocHost_v3020_params>(cb).size; break;
    case RT(cudaHostAlloc_v3020): c.op = Op::alloc; c.bytes = prm<cudaHostAlloc_v3020_params>(cb).size; break;
    case RT(cudaMallocManaged_v6000): c.op = Op::alloc; c.bytes = prm<cudaMallocManaged_v6000_params>(cb).size; break;
    case RT(cudaMallocPitch_v3020): {
      const auto& p = prm<cudaMallocPitch_v3020_params>(cb);
      c.op = Op::alloc;
      c.bytes = p.width * p.height;
      break;
    }
    case RT(cudaMalloc3D_v3020):
    case RT(cudaMallocArray_v3020):
    case RT(cudaMalloc3DArray_v3020):
    case RT(cudaMallocMipmappedArray_v5000): c.op = Op::alloc; break;
    case RT(cudaFree_v3020):
      // cudaFree(nullptr) is the customary "initialize the context" call: not a free.
      if (prm<cudaFree_v3020_params>(cb).devPtr) c.op = Op::free_;
      break;
    case RT(cudaFreeHost_v3020):
    case RT(cudaFreeArray_v3020):
    case RT(cudaFreeMipmappedArray_v5000): c.op = Op::free_; break;
    case RT(cudaMallocAsync_v11020):
    case RT(cudaMallocAsync_ptsz_v11020): {
      const auto& p = prm<cudaMallocAsync_v11020_params>(cb);
      c.op = Op::alloc_async;
      c.bytes = p.size;
      c.has_stream = true;
      c.stream = u(p.hStream);
      c.ptsz = id == RT(cudaMallocAsync_ptsz_v11020);
      break;
    }
    case RT(cudaMallocFromPoolAsync_v11020):
    case RT(cudaMallocFromPoolAsync_ptsz_v11020): {
      const auto& p = prm<cudaMallocFromPoolAsync_v11020_params>(cb);
      c.op = Op::alloc_async;
      c.bytes = p.size;
      c.has_stream = true;
      c.stream = u(p.stream);
      c.ptsz = id == RT(cudaMallocFromPoolAsync_ptsz_v11020);
      break;
    }
    case RT(cudaFreeAsync_v11020):
    case RT(cudaFreeAsync_ptsz_v11020): {
      const auto& p = prm<cudaFreeAsync_v11020_params>(cb);
      c.op = Op::free_async;
      c.has_stream = true;
      c.stream = u(p.hStream);
      c.ptsz = id == RT(cudaFreeAsync_ptsz_v11020);
      break;
    }
    case RT(cudaDeviceSynchronize_v3020): c.op = Op::sync_device; break;
    case RT(cudaStreamSynchronize_v3020):
    case RT(cudaStreamSynchronize_ptsz_v7000):
      c.op = Op::sync_stream;
      c.has_stream = true;
      c.stream = u(prm<cudaStreamSynchronize_v3020_params>(cb).stream);
      c.ptsz = id == RT(cudaStreamSynchronize_ptsz_v7000);
      break;
    case RT(cudaStreamQuery_v3020):
    case RT(cudaStreamQuery_ptsz_v7000):
      c.op = Op::query_stream;
      c.has_stream = true;
      c.stream = u(prm<cudaStreamQuery_v3020_params>(cb).stream);
      c.ptsz = id == RT(cudaStreamQuery_ptsz_v7000);
      break;
    case RT(cudaEventSynchronize_v3020): c.op = Op::sync_event; c.event = prm<cudaEventSynchronize_v3020_params>(cb).event; break;
    case RT(cudaEventQuery_v3020): c.op = Op::query_event; c.event = prm<cudaEventQuery_v3020_params>(cb).event; break;
    case RT(cudaMemcpy_v3020):
    case RT(cudaMemcpy_ptds_v7000): {
      const auto& p = prm<cudaMemcpy_v3020_params>(cb);
      c.op = kind_op(p.kind, false);
      c.bytes = p.count;
      c.dst = p.dst;
      c.src = p.src;
      break;
    }
    case RT(cudaMemcpyAsync_v3020):
    case RT(cudaMemcpyAsync_ptsz_v7000): {
      const auto& p = prm<cudaMemcpyAsync_v3020_params>(cb);
      c.op = kind_op(p.kind, true);
      c.bytes = p.count;
      c.dst = p.dst;
      c.src = p.src;
      c.has_stream = true;
      c.stream = u(p.stream);
      c.ptsz = id == RT(cudaMemcpyAsync_ptsz_v7000);
      break;
    }
    case RT(cudaMemcpy2D_v3020):
    case RT(cudaMemcpy2D_ptds_v7000): {
      const auto& p = prm<cudaMemcpy2D_v3020_params>(cb);
      c.op = kind_op(p.kind, false);
      c.bytes = p.width * p.height;
      c.dst = p.dst;
      c.src = p.src;
      break;
    }
    case RT(cudaMemcpy2DAsync_v3020):
    case RT(cudaMemcpy2DAsync_ptsz_v7000): {
      const auto& p = prm<cudaMemcpy2DAsync_v3020_params>(cb);
      c.op = kind_op(p.kind, true);
      c.bytes = p.width * p.height;
      c.dst = p.dst;
      c.src = p.src;
      c.has_stream = true;
      c.stream = u(p.stream);
      c.ptsz = id == RT(cudaMemcpy2DAsync_ptsz_v7000);
      break;
    }
    case RT(cudaMemcpyFromSymbol_v3020):
    case RT(cudaMemcpyFromSymbol_ptds_v7000): {
      const auto& p = prm<cudaMemcpyFromSymbol_v3020_params>(cb);
      c.op = (p.kind == cudaMemcpyDeviceToHost || p.kind == cudaMemcpyDefault) ? Op::d2h_sync : Op::none;
      c.bytes = p.count;
      break;
    }
    case RT(cudaMemcpyFromSymbolAsync_v3020):
    case RT(cudaMemcpyFromSymbolAsync_ptsz_v7000): {
      const auto& p = prm<cudaMemcpyFromSymbolAsync_v3020_params>(cb);
      c.op = (p.kind == cudaMemcpyDeviceToHost || p.kind == cudaMemcpyDefault) ? Op::d2h_async : Op::none;
      c.bytes = p.count;
      c.has_stream = true;
      c.stream = u(p.stream);
      c.ptsz = id == RT(cudaMemcpyFromSymbolAsync_ptsz_v7000);
      break;
    }
    case RT(cudaStreamBeginCapture_v10000):
    case RT(cudaStreamBeginCapture_ptsz_v10000): {
      const auto& p = prm<cudaStreamBeginCapture_v10000_params>(cb);
      c.op = Op::begin_capture;
      c.has_stream = true;
      c.stream = u(p.stream);
      c.mode = static_cast<int>(p.mode);
      c.ptsz = id == RT(cudaStreamBeginCapture_ptsz_v10000);
      break;
    }
    case RT(cudaStreamBeginCaptureToGraph_v12030):
    case RT(cudaStreamBeginCaptureToGraph_ptsz_v12030): {
      const auto& p = prm<cudaStreamBeginCaptureToGraph_v12030_params>(cb);
      c.op = Op::begin_capture;
      c.has_stream = true;
      c.stream = u(p.stream);
      c.mode = static_cast<int>(p.mode);
      c.ptsz = id == RT(cudaStreamBeginCaptureToGraph_ptsz_v12030);
      break;
    }
    case RT(cudaStreamEndCapture_v10000):
    case RT(cudaStreamEndCapture_ptsz_v10000):
      c.op = Op::end_capture;
      c.has_stream = true;
      c.stream = u(prm<cudaStreamEndCapture_v10000_params>(cb).stream);
      c.ptsz = id == RT(cudaStreamEndCapture_ptsz_v10000);
      break;
    case RT(cudaGraphLaunch_v10000):
    case RT(cudaGraphLaunch_ptsz_v10000): {
      const auto& p = prm<cudaGraphLaunch_v10000_params>(cb);
      c.op = Op::graph_launch;
      c.exec = p.graphExec;
      c.has_stream = true;
      c.stream = u(p.stream);
      c.ptsz = id == RT(cudaGraphLaunch_ptsz_v10000);
      break;
    }
    case RT(cudaEventRecord_v3020):
    case RT(cudaEventRecord_ptsz_v7000): {
      const auto& p = prm<cudaEventRecord_v3020_params>(cb);
      c.op = Op::event_record;
      c.event = p.event;
      c.has_stream = true;
      c.stream = u(p.stream);
      c.ptsz = id == RT(cudaEventRecord_ptsz_v7000);
      break;
    }
    case RT(cudaEventRecordWithFlags_v11010):
    case RT(cudaEventRecordWithFlags_ptsz_v11010): {
      const auto& p = prm<cudaEventRecordWithFlags_v11010_params>(cb);
      c.op = Op::event_record;
      c.event = p.event;
      c.has_stream = true;
      c.stream = u(p.stream);
      c.ptsz = id == RT(cudaEventRecordWithFlags_ptsz_v11010);
      break;
    }
    case RT(cudaStreamWaitEvent_v3020):
    case RT(cudaStreamWaitEvent_ptsz_v7000): {
      const auto& p = prm<cudaStreamWaitEvent_v3020_params>(cb);
      c.op = Op::stream_wait_event;
      c.event = p.event;
      c.has_stream = true;
      c.stream = u(p.stream);
      c.ptsz = id == RT(cudaStreamWaitEvent_ptsz_v7000);
      break;
    }
    case RT(cudaThreadExchangeStreamCaptureMode_v10010):
      c.op = Op::exchange_mode;
      c.mode_ptr = reinterpret_cast<int*>(prm<cudaThreadExchangeStreamCaptureMode_v10010_params>(cb).mode);
      break;
    case RT(cudaGraphExecDestroy_v10000): c.op = Op::exec_destroy; c.exec = prm<cudaGraphExecDestroy_v10000_params>(cb).graphExec; break;
    case RT(cudaEventDestroy_v3020): c.op = Op::event_destroy; c.event = prm<cudaEventDestroy_v3020_params>(cb).event; break;
    default: break;
  }
#undef RT
  return c;
}

#define DRV(name) CUPTI_DRIVER_TRACE_CBID_##name
// Driver callbacks we enable (the rest of the driver domain stays off).
const CUpti_CallbackId kDriverIds[] = {
    DRV(cuMemAlloc_v2), DRV(cuMemAllocHost_v2), DRV(cuMemHostAlloc), DRV(cuMemAllocManaged), DRV(cuMemAllocPitch_v2),
    DRV(cuMemCreate), DRV(cuMemFree_v2), DRV(cuMemFreeHost), DRV(cuMemRelease), DRV(cuMemAllocAsync),
    DRV(cuMemAllocAsync_ptsz), DRV(cuMemAllocFromPoolAsync), DRV(cuMemAllocFromPoolAsync_ptsz), DRV(cuMemFreeAsync),
    DRV(cuMemFreeAsync_ptsz), DRV(cuCtxSynchronize), DRV(cuCtxSynchronize_v2), DRV(cuStreamSynchronize),
    DRV(cuStreamSynchronize_ptsz), DRV(cuStreamQuery), DRV(cuStreamQuery_ptsz), DRV(cuEventSynchronize),
    DRV(cuEventQuery), DRV(cuMemcpyDtoH_v2), DRV(cuMemcpyDtoH_v2_ptds), DRV(cuMemcpyDtoHAsync_v2),
    DRV(cuMemcpyDtoHAsync_v2_ptsz), DRV(cuMemcpy), DRV(cuMemcpyAsync), DRV(cuStreamBeginCapture),
    DRV(cuStreamBeginCapture_ptsz), DRV(cuStreamBeginCapture_v2), DRV(cuStreamBeginCapture_v2_ptsz),
    DRV(cuStreamBeginCaptureToGraph), DRV(cuStreamBeginCaptureToGraph_ptsz), DRV(cuStreamEndCapture),
    DRV(cuStreamEndCapture_ptsz), DRV(cuGraphLaunch), DRV(cuGraphLaunch_ptsz), DRV(cuEventRecord),
    DRV(cuEventRecord_ptsz), DRV(cuEventRecordWithFlags), DRV(cuEventRecordWithFlags_ptsz), DRV(cuStreamWaitEvent),
    DRV(cuStreamWaitEvent_ptsz), DRV(cuThreadExchangeStreamCaptureMode), DRV(cuGraphExecDestroy),
    DRV(cuEventDestroy_v2),
};

Call decode_driver(CUpti_CallbackId id, const CUpti_CallbackData* cb) {
  Call c;
  auto stream = [&](CUstream s, bool ptsz) {
    c.has_stream = true;
    c.stream = u(s);
    c.ptsz = ptsz;
  };
  switch (id) {
    case DRV(cuMemAlloc_v2): c.op = Op::alloc; c.bytes = prm<cuMemAlloc_v2_params>(cb).bytesize; break;
    case DRV(cuMemAllocHost_v2): c.op = Op::alloc; c.bytes = prm<cuMemAllocHost_v2_params>(cb).bytesize; break;
    case DRV(cuMemHostAlloc): c.op = Op::alloc; c.bytes = prm<cuMemHostAlloc_params>(cb).bytesize; break;
    case DRV(cuMemAllocManaged): c.op = Op::alloc; c.bytes = prm<cuMemAllocManaged_params>(cb).bytesize; break;
    case DRV(cuMemAllocPitch_v2): {
      const auto& p = prm<cuMemAllocPitch_v2_params>(cb);
      c.op = Op::alloc;
      c.bytes = p.WidthInBytes * p.Height;
      break;
    }
    case DRV(cuMemCreate): c.op = Op::alloc; c.bytes = prm<cuMemCreate_params>(cb).size; break;
    case DRV(cuMemFree_v2): if (prm<cuMemFree_v2_params>(cb).dptr) c.op = Op::free_; break;
    case DRV(cuMemFreeHost):
    case DRV(cuMemRelease): c.op = Op::free_; break;
    case DRV(cuMemAllocAsync):
    case DRV(cuMemAllocAsync_ptsz): {
      const auto& p = prm<cuMemAllocAsync_params>(cb);
      c.op = Op::alloc_async;
      c.bytes = p.bytesize;
      stream(p.hStream, id == DRV(cuMemAllocAsync_ptsz));
      break;
    }
    case DRV(cuMemAllocFromPoolAsync):
    case DRV(cuMemAllocFromPoolAsync_ptsz): {
      const auto& p = prm<cuMemAllocFromPoolAsync_params>(cb);
      c.op = Op::alloc_async;
      c.bytes = p.bytesize;
      stream(p.hStream, id == DRV(cuMemAllocFromPoolAsync_ptsz));
      break;
    }
    case DRV(cuMemFreeAsync):
    case DRV(cuMemFreeAsync_ptsz):
      c.op = Op::free_async;
      stream(prm<cuMemFreeAsync_params>(cb).hStream, id == DRV(cuMemFreeAsync_ptsz));
      break;
    case DRV(cuCtxSynchronize):
    case DRV(cuCtxSynchronize_v2): c.op = Op::sync_device; break;
    case DRV(cuStreamSynchronize):
    case DRV(cuStreamSynchronize_ptsz):
      c.op = Op::sync_stream;
      stream(prm<cuStreamSynchronize_params>(cb).hStream, id == DRV(cuStreamSynchronize_ptsz));
      break;
    case DRV(cuStreamQuery):
    case DRV(cuStreamQuery_ptsz):
      c.op = Op::query_stream;
      stream(prm<cuStreamQuery_params>(cb).hStream, id == DRV(cuStreamQuery_ptsz));
      break;
    case DRV(cuEventSynchronize): c.op = Op::sync_event; c.event = prm<cuEventSynchronize_params>(cb).hEvent; break;
    case DRV(cuEventQuery): c.op = Op::query_event; c.event = prm<cuEventQuery_params>(cb).hEvent; break;
    case DRV(cuMemcpyDtoH_v2):
    case DRV(cuMemcpyDtoH_v2_ptds): c.op = Op::d2h_sync; c.bytes = prm<cuMemcpyDtoH_v2_params>(cb).ByteCount; break;
    case DRV(cuMemcpyDtoHAsync_v2):
    case DRV(cuMemcpyDtoHAsync_v2_ptsz): {
      const auto& p = prm<cuMemcpyDtoHAsync_v2_params>(cb);
      c.op = Op::d2h_async;
      c.bytes = p.ByteCount;
      stream(p.hStream, id == DRV(cuMemcpyDtoHAsync_v2_ptsz));
      break;
    }
    case DRV(cuMemcpy): {
      const auto& p = prm<cuMemcpy_params>(cb);
      c.op = Op::memcpy_maybe_d2h_sync;
      c.bytes = p.ByteCount;
      c.dst = reinterpret_cast<const void*>(p.dst);
      c.src = reinterpret_cast<const void*>(p.src);
      break;
    }
    case DRV(cuMemcpyAsync): {
      const auto& p = prm<cuMemcpyAsync_params>(cb);
      c.op = Op::memcpy_maybe_d2h_async;
      c.bytes = p.ByteCount;
      c.dst = reinterpret_cast<const void*>(p.dst);
      c.src = reinterpret_cast<const void*>(p.src);
      stream(p.hStream, false);
      break;
    }
    case DRV(cuStreamBeginCapture):
    case DRV(cuStreamBeginCapture_ptsz):
      c.op = Op::begin_capture;
      stream(prm<cuStreamBeginCapture_params>(cb).hStream, id == DRV(cuStreamBeginCapture_ptsz));
      break;
    case DRV(cuStreamBeginCapture_v2):
    case DRV(cuStreamBeginCapture_v2_ptsz): {
      const auto& p = prm<cuStreamBeginCapture_v2_params>(cb);
      c.op = Op::begin_capture;
      c.mode = static_cast<int>(p.mode);
      stream(p.hStream, id == DRV(cuStreamBeginCapture_v2_ptsz));
      break;
    }
    case DRV(cuStreamBeginCaptureToGraph):
    case DRV(cuStreamBeginCaptureToGraph_ptsz): {
      const auto& p = prm<cuStreamBeginCaptureToGraph_params>(cb);
      c.op = Op::begin_capture;
      c.mode = static_cast<int>(p.mode);
      stream(p.hStream, id == DRV(cuStreamBeginCaptureToGraph_ptsz));
      break;
    }
    case DRV(cuStreamEndCapture):
    case DRV(cuStreamEndCapture_ptsz):
      c.op = Op::end_capture;
      stream(prm<cuStreamEndCapture_params>(cb).hStream, id == DRV(cuStreamEndCapture_ptsz));
      break;
    case DRV(cuGraphLaunch):
    case DRV(cuGraphLaunch_ptsz): {
      const auto& p = prm<cuGraphLaunch_params>(cb);
      c.op = Op::graph_launch;
      c.exec = p.hGraph;
      stream(p.hStream, id == DRV(cuGraphLaunch_ptsz));
      break;
    }
    case DRV(cuEventRecord):
    case DRV(cuEventRecord_ptsz): {
      const auto& p = prm<cuEventRecord_params>(cb);
      c.op = Op::event_record;
      c.event = p.hEvent;
      stream(p.hStream, id == DRV(cuEventRecord_ptsz));
      break;
    }
    case DRV(cuEventRecordWithFlags):
    case DRV(cuEventRecordWithFlags_ptsz): {
      const auto& p = prm<cuEventRecordWithFlags_params>(cb);
      c.op = Op::event_record;
      c.event = p.hEvent;
      stream(p.hStream, id == DRV(cuEventRecordWithFlags_ptsz));
      break;
    }
    case DRV(cuStreamWaitEvent):
    case DRV(cuStreamWaitEvent_ptsz): {
      const auto& p = prm<cuStreamWaitEvent_params>(cb);
      c.op = Op::stream_wait_event;
      c.event = p.hEvent;
      stream(p.hStream, id == DRV(cuStreamWaitEvent_ptsz));
      break;
    }
    case DRV(cuThreadExchangeStreamCaptureMode):
      c.op = Op::exchange_mode;
      c.mode_ptr = reinterpret_cast<int*>(prm<cuThreadExchangeStreamCaptureMode_params>(cb).mode);
      break;
    case DRV(cuGraphExecDestroy): c.op = Op::exec_destroy; c.exec = prm<cuGraphExecDestroy_params>(cb).hGraphExec; break;
    case DRV(cuEventDestroy_v2): c.op = Op::event_destroy; c.event = prm<cuEventDestroy_v2_params>(cb).hEvent; break;
    default: break;
  }
  return c;
}
#undef DRV

// ---- handling -----------------------------------------------------------------------------------

const char* kind_of(Op op) {
  switch (op) {
    case Op::alloc: return "alloc";
    case Op::free_: return "free";
    case Op::alloc_async: return "alloc-async";
    case Op::free_async: return "free-async";
    case Op::sync_device:
    case Op::sync_stream:
    case Op::sync_event:
    case Op::query_stream: return "host-sync";
    default: return "d2h-copy";
  }
}

std::string reason_of(Op op, std::uint64_t bytes, int mode) {
  std::string r;
  switch (op) {
    case Op::alloc:
      r = "raw allocation while a stream is capturing: it runs once, now, and is not part of the graph; every "
          "replay reuses what it returned and nothing allocates for a larger later size. Allocate before the "
          "capture, or from a graphsafe Arena (request/allocate, ArenaResource, thrust_allocator)";
      break;
    case Op::free_:
      r = "raw free while a stream is capturing: the memory is released now, but the graph may still use it at "
          "replay (use after free). Free after the graph that uses it is destroyed";
      break;
    case Op::alloc_async:
      r = "stream-ordered allocation (" + std::to_string(bytes) +
          " B) inside the capture becomes a graph memory node outside the arena: its size is frozen at the "
          "capture-time value and no guard checks it at replay. Size it from a capacity through a graphsafe Arena "
          "(Arena::request / ArenaResource) or allocate it before the capture";
      break;
    case Op::free_async:
      r = "stream-ordered free inside the capture becomes a graph free node: memory the graph did not allocate "
          "is freed at every replay. Free it after the graph is destroyed";
      break;
    case Op::sync_device:
    case Op::sync_stream:
    case Op::sync_event:
    case Op::query_stream:
      r = "host synchronization while a stream is capturing: captured work has not run yet, the wait is not part "
          "of the graph, and any value the host reads after it is stale and frozen into the graph. Keep the value "
          "on the device (read it in the kernel) or move the synchronization out of the capture";
      break;
    default:
      r = "device-to-host copy while a stream is capturing: captured work has not run yet, the host reads stale "
          "data now, and whatever it computes from it (a size, a loop count, .item()) is frozen into the graph. "
          "Keep the value on the device (read it in the kernel)";
      break;
  }
  if (mode != CU_STREAM_CAPTURE_MODE_RELAXED && (op == Op::alloc || op == Op::free_ || op == Op::sync_device ||
                                                 op == Op::sync_stream || op == Op::sync_event || op == Op::d2h_sync))
    r += std::string(" (in ") + mode_name(mode) +
         " mode CUDA also rejects the call and invalidates the capture; in relaxed mode it would succeed silently)";
  return r;
}

void on_begin_capture(const Call& c) {
  const std::uintptr_t s = normalize(c.stream, c.ptsz);
  const CaptureQuery q = query_capture(s);
  std::lock_guard g(st().mu);
  Capture cap;
  cap.key = key_of(s);
  cap.stream = s;
  cap.mode = c.mode;
  cap.id = q.id;
  cap.thread = tid();
  st().captures[cap.key] = std::move(cap);
  st().captures_seen++;
  st().active_captures.store(static_cast<int>(st().captures.size()), std::memory_order_release);
}

void on_end_capture(const Call& c) {
  const std::uintptr_t s = normalize(c.stream, c.ptsz);
  const CaptureQuery q = query_capture(s);
  if (q.active) return;  // EndCapture failed (wrong thread): still capturing
  State& S = st();
  std::lock_guard g(S.mu);
  auto it = S.captures.find(key_of(s));
  if (it == S.captures.end()) return;
  std::size_t unprinted = 0;
  for (std::size_t idx : it->second.findings)
    if (!S.printed[idx] && S.findings[idx].severity != "note") ++unprinted;
  if (unprinted) {
    std::fprintf(stderr, "graphsafe-cupti: capture %" PRIu64 " (stream %s, mode %s) ended with %zu finding(s):\n",
                 it->second.id, hex(it->second.stream).c_str(), mode_name(it->second.mode), unprinted);
    for (std::size_t idx : it->second.findings)
      if (!S.printed[idx] && S.findings[idx].severity != "note") {
        print_finding(S.findings[idx]);
        S.printed[idx] = true;
      }
  }
  S.captures.erase(it);
  S.active_captures.store(static_cast<int>(S.captures.size()), std::memory_order_release);
}

void check_unsafe(const Call& c0, const char* api) {
  if (st().active_captures.load(std::memory_order_acquire) == 0) return;
  Call c = c0;
  if (c.op == Op::memcpy_maybe_d2h_sync || c.op == Op::memcpy_maybe_d2h_async) {
    if (!(is_device_pointer(c.src) && !is_device_pointer(c.dst))) return;
    c.op = c.op == Op::memcpy_maybe_d2h_sync ? Op::d2h_sync : Op::d2h_async;
  }
  std::uintptr_t s = 0;
  CaptureQuery q;
  if (c.has_stream) {
    s = normalize(c.stream, c.ptsz);
    q = query_capture(s);
  }
  // Stream-ordered work on a stream that is not capturing is not frozen into a graph: an async
  // allocation, free or D2H copy there is eager work of another pipeline. Only a query of a
  // capturing stream is a problem (a query of an idle one is not a wait).
  const bool stream_ordered =
      c.op == Op::alloc_async || c.op == Op::free_async || c.op == Op::d2h_async || c.op == Op::query_stream;
  if (stream_ordered && !q.active) return;

  std::vector<std::string> bt = caller_backtrace(api);
  const long me = tid();
  State& S = st();
  std::lock_guard g(S.mu);
  if (S.captures.empty() && !q.active) return;
  Capture* cap = nullptr;
  if (q.active)
    for (auto& [k, v] : S.captures)
      if (v.id == q.id) cap = &v;
  if (!cap)
    for (auto& [k, v] : S.captures)
      if (v.thread == me) cap = &v;
  if (!cap)
    for (auto& [k, v] : S.captures)
      if (v.mode == CU_STREAM_CAPTURE_MODE_GLOBAL) cap = &v;
  if (!cap && !S.captures.empty()) cap = &S.captures.begin()->second;

  Finding f;
  f.kind = kind_of(c.op);
  f.api = api ? api : "?";
  f.bytes = c.bytes;
  f.stream = c.has_stream ? s : 0;
  f.on_capturing_stream = q.active;
  f.thread = me;
  f.backtrace = std::move(bt);
  f.site = f.backtrace.empty() ? std::string("?") : f.backtrace.front();
  int mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (cap) {
    f.capture_id = cap->id;
    f.capture_stream = cap->stream;
    f.capture_mode = mode_name(cap->mode);
    f.capture_thread = cap->thread;
    mode = cap->mode;
  } else if (q.active) {
    f.capture_id = q.id;
    f.capture_stream = s;
    f.capture_mode = "unknown";
  }
  f.reason = reason_of(c.op, c.bytes, mode);
  if (t_interaction_mode == CU_STREAM_CAPTURE_MODE_RELAXED && !q.active) {
    f.severity = "note";
    f.reason = "deliberate: the calling thread switched its capture interaction mode to relaxed "
               "(cudaThreadExchangeStreamCaptureMode) before this call, as PyTorch's caching allocator does to grow "
               "a graph's private pool; the caller must keep the memory alive until replay. " +
               f.reason;
  } else if (q.active || (cap && (cap->thread == me || cap->mode == CU_STREAM_CAPTURE_MODE_GLOBAL))) {
    f.severity = "error";
  } else {
    f.severity = "warning";
    f.reason = "made on another thread than the capture's (" + f.capture_mode +
               " mode): not part of the graph; make sure nothing the capture uses depends on it. " + f.reason;
  }
  add_finding_locked(std::move(f), cap, false);
}

// ---- one graph exec, two streams ----------------------------------------------------------------

void on_graph_launch_enter(const Call& c, const char* api) {
  const std::uintptr_t s = normalize(c.stream, c.ptsz);
  if (st().active_captures.load(std::memory_order_acquire) != 0 && query_capture(s).active) return;  // child graph
  const std::uintptr_t key = key_of(s);
  State& S = st();
  LaunchRec prev;
  {
    std::lock_guard g(S.mu);
    auto it = S.execs.find(c.exec);
    if (it == S.execs.end() || it->second.key == key) return;
    prev = it->second;
    if (S.synced[prev.key] >= prev.seq) return;
    if (auto w = S.waited.find({key, prev.key}); w != S.waited.end() && w->second >= prev.seq) return;
  }
  std::vector<std::string> bt = caller_backtrace(api);
  std::lock_guard g(S.mu);
  Finding f;
  f.severity = "error";
  f.kind = "graph-launch-concurrent";
  f.api = api;
  f.stream = s;
  f.thread = tid();
  f.backtrace = std::move(bt);
  f.site = f.backtrace.empty() ? std::string("?") : f.backtrace.front();
  f.reason = "graph exec " + hex(u(c.exec)) + " launched on stream " + hex(s) + " while its previous launch on stream " +
             hex(prev.key) + " (thread " + std::to_string(prev.thread) +
             ") is not ordered before it (no synchronization of that stream, no event recorded there after the "
             "launch and waited on here): CUDA serializes the two launches, but work issued around them on the two "
             "streams (copies into the graph's static inputs, reads of its outputs, other graphs sharing its "
             "workspace) races with the one still running. Replay a graph on one stream, or order the new stream "
             "after the old one (cudaEventRecord + cudaStreamWaitEvent)";
  add_finding_locked(std::move(f), nullptr, true);
}

void on_graph_launch_exit(const Call& c) {
  const std::uintptr_t s = normalize(c.stream, c.ptsz);
  if (st().active_captures.load(std::memory_order_acquire) != 0 && query_capture(s).active) return;
  const std::uintptr_t key = key_of(s);
  std::lock_guard g(st().mu);
  const std::uint64_t n = ++st().seq[key];
  st().execs[c.exec] = LaunchRec{key, n, tid()};
}

void on_event_record_exit(const Call& c) {
  const std::uintptr_t s = normalize(c.stream, c.ptsz);
  if (st().active_captures.load(std::memory_order_acquire) != 0 && query_capture(s).active) {
    std::lock_guard g(st().mu);
    st().events.erase(c.event);  // a captured record says nothing about eager ordering
    return;
  }
  const std::uintptr_t key = key_of(s);
  std::lock_guard g(st().mu);
  st().events[c.event] = {key, st().seq[key]};
}

void on_wait_event_exit(const Call& c) {
  const std::uintptr_t key = key_of(normalize(c.stream, c.ptsz));
  std::lock_guard g(st().mu);
  auto it = st().events.find(c.event);
  if (it == st().events.end()) return;
  auto& w = st().waited[{key, it->second.first}];
  w = std::max(w, it->second.second);
}

void mark_synced(std::uintptr_t key, std::uint64_t seq) {
  auto& v = st().synced[key];
  v = std::max(v, seq);
}

void on_sync_exit(const Call& c) {
  std::lock_guard g(st().mu);
  State& S = st();
  if (c.op == Op::sync_device || (c.op == Op::sync_stream && normalize(c.stream, c.ptsz) == kLegacy)) {
    for (auto& [k, n] : S.seq) mark_synced(k, n);
  } else if (c.op == Op::sync_stream || c.op == Op::query_stream) {
    const std::uintptr_t key = key_of(normalize(c.stream, c.ptsz));
    mark_synced(key, S.seq[key]);
  } else if (c.op == Op::sync_event || c.op == Op::query_event) {
    if (auto it = S.events.find(c.event); it != S.events.end()) mark_synced(it->second.first, it->second.second);
  }
}

int return_code(const CUpti_CallbackData* cb) {
  return cb->functionReturnValue ? *static_cast<const int*>(cb->functionReturnValue) : 0;
}

void handle(const Call& c, const CUpti_CallbackData* cb) {
  const bool enter = cb->callbackSite == CUPTI_API_ENTER;
  const char* api = cb->functionName;
  switch (c.op) {
    case Op::none: return;
    case Op::begin_capture:
      if (!enter && return_code(cb) == 0) on_begin_capture(c);
      return;
    case Op::end_capture:
      if (!enter) on_end_capture(c);
      return;
    case Op::exchange_mode:
      if (enter)
        t_pending_mode = c.mode_ptr ? *c.mode_ptr : -1;
      else if (return_code(cb) == 0 && t_pending_mode >= 0)
        t_interaction_mode = t_pending_mode;
      return;
    case Op::graph_launch:
      if (enter)
        on_graph_launch_enter(c, api);
      else if (return_code(cb) == 0)
        on_graph_launch_exit(c);
      return;
    case Op::event_record:
      if (!enter && return_code(cb) == 0) on_event_record_exit(c);
      return;
    case Op::stream_wait_event:
      if (!enter && return_code(cb) == 0) on_wait_event_exit(c);
      return;
    case Op::exec_destroy:
      if (enter) {
        std::lock_guard g(st().mu);
        st().execs.erase(c.exec);
      }
      return;
    case Op::event_destroy:
      if (enter) {
        std::lock_guard g(st().mu);
        st().events.erase(c.event);
      }
      return;
    case Op::query_event:
      if (!enter && return_code(cb) == 0) on_sync_exit(c);
      return;
    case Op::sync_device:
    case Op::sync_stream:
    case Op::sync_event:
    case Op::query_stream:
      if (enter)
        check_unsafe(c, api);
      else if (return_code(cb) == 0)
        on_sync_exit(c);
      return;
    default:
      if (enter) check_unsafe(c, api);
      return;
  }
}

void CUPTIAPI callback(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  if (t_in_tool || st().exiting.load(std::memory_order_relaxed)) return;
  const auto* cb = static_cast<const CUpti_CallbackData*>(data);
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API) {
    if (cb->callbackSite == CUPTI_API_ENTER) {
      if (++t_rt_depth == 1) handle(decode_runtime(cbid, cb), cb);
    } else {
      if (t_rt_depth <= 0) {
        t_rt_depth = 0;
        return;
      }
      if (t_rt_depth == 1) handle(decode_runtime(cbid, cb), cb);
      --t_rt_depth;
    }
  } else if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
    if (t_rt_depth > 0) return;  // made by the runtime on behalf of a runtime call we saw
    handle(decode_driver(cbid, cb), cb);
  }
}

// ---- report -------------------------------------------------------------------------------------

std::string json_str(const std::string& s) {
  std::string o = "\"";
  for (unsigned char ch : s) {
    switch (ch) {
      case '"': o += "\\\""; break;
      case '\\': o += "\\\\"; break;
      case '\n': o += "\\n"; break;
      case '\t': o += "\\t"; break;
      default:
        if (ch < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", ch);
          o += b;
        } else {
          o += static_cast<char>(ch);
        }
    }
  }
  return o + "\"";
}

std::string finding_json(const Finding& f) {
  std::string o = "    {";
  o += "\"severity\": " + json_str(f.severity);
  o += ", \"kind\": " + json_str(f.kind);
  o += ", \"api\": " + json_str(f.api);
  o += ", \"site\": " + json_str(f.site);
  o += ", \"reason\": " + json_str(f.reason);
  o += ", \"bytes\": " + std::to_string(f.bytes);
  o += ", \"stream\": " + json_str(hex(f.stream));
  o += ", \"on_capturing_stream\": " + std::string(f.on_capturing_stream ? "true" : "false");
  o += ", \"capture\": {\"id\": " + std::to_string(f.capture_id) + ", \"stream\": " + json_str(hex(f.capture_stream)) +
       ", \"mode\": " + json_str(f.capture_mode) + ", \"thread\": " + std::to_string(f.capture_thread) + "}";
  o += ", \"thread\": " + std::to_string(f.thread);
  o += ", \"count\": " + std::to_string(f.count);
  o += ", \"backtrace\": [";
  for (std::size_t i = 0; i < f.backtrace.size(); ++i) o += (i ? ", " : "") + json_str(f.backtrace[i]);
  o += "]}";
  return o;
}

std::string report_path_impl() {
  if (const char* p = std::getenv("GRAPHSAFE_CUPTI_REPORT"); p && *p) return p;
  // graphsafe's own debug report writes GRAPHSAFE_DEBUG_REPORT: do not overwrite it when it is here.
  if (const char* p = std::getenv("GRAPHSAFE_DEBUG_REPORT"); p && *p)
    return debug_hook() ? std::string(p) + ".cupti.json" : std::string(p);
  return "graphsafe_cupti_report.json";
}

bool write_report_impl(const std::string& path_in) {
  const std::string path = path_in.empty() ? report_path_impl() : path_in;
  State& S = st();
  std::string body;
  std::size_t nfind = 0, nnote = 0;
  {
    std::lock_guard g(S.mu);
    std::string f, n;
    for (const auto& x : S.findings) {
      std::string& dst = x.severity == "note" ? n : f;
      dst += (dst.empty() ? "\n" : ",\n") + finding_json(x);
      (x.severity == "note" ? nnote : nfind)++;
    }
    body = "{\n  \"tool\": \"graphsafe_cupti\",\n  \"version\": 1,\n  \"pid\": " + std::to_string(::getpid()) +
           ",\n  \"enabled\": " + (S.enabled ? "true" : "false") + ",\n  \"captures\": " +
           std::to_string(S.captures_seen) + ",\n  \"finding_count\": " + std::to_string(nfind) +
           ",\n  \"findings\": [" + f + (f.empty() ? "" : "\n  ") + "],\n  \"notes\": [" + n + (n.empty() ? "" : "\n  ") +
           "]\n}\n";
  }
  std::FILE* fp = std::fopen(path.c_str(), "w");
  if (!fp) {
    std::fprintf(stderr, "graphsafe-cupti: cannot write the report to %s: %s\n", path.c_str(), std::strerror(errno));
    return false;
  }
  std::fputs(body.c_str(), fp);
  std::fclose(fp);
  return true;
}

void at_exit() {
  State& S = st();
  S.exiting.store(true);
  {
    std::lock_guard g(S.mu);
    for (std::size_t i = 0; i < S.findings.size(); ++i)
      if (!S.printed[i] && S.findings[i].severity != "note") {
        print_finding(S.findings[i]);
        S.printed[i] = true;
      }
  }
  const std::string path = report_path_impl();
  if (write_report_impl(path)) {
    std::size_t n = 0, notes = 0;
    {
      std::lock_guard g(S.mu);
      for (const auto& f : S.findings) (f.severity == "note" ? notes : n) += 1;
    }
    std::fprintf(stderr, "graphsafe-cupti: %zu finding(s), %zu note(s) in %" PRIu64 " capture(s); report: %s\n", n,
                 notes, S.captures_seen, path.c_str());
  }
}

}  // namespace

bool enable() {
  State& S = st();
  std::lock_guard g(S.mu);
  if (S.enabled) return true;
  InTool guard;
  CUptiResult r = cuptiSubscribe(&S.subscriber, reinterpret_cast<CUpti_CallbackFunc>(&callback), nullptr);
  if (r != CUPTI_SUCCESS) {
    const char* msg = "?";
    cuptiGetResultString(r, &msg);
    std::fprintf(stderr,
                 "graphsafe-cupti: cannot subscribe to CUPTI callbacks (%s); capture-unsafe calls will NOT be "
                 "reported. Another CUPTI client (a profiler, another injection library) may be active.\n",
                 msg);
    S.subscriber = nullptr;
    return false;
  }
  r = cuptiEnableDomain(1, S.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
  for (CUpti_CallbackId id : kDriverIds)
    if (r == CUPTI_SUCCESS) r = cuptiEnableCallback(1, S.subscriber, CUPTI_CB_DOMAIN_DRIVER_API, id);
  if (r != CUPTI_SUCCESS) {
    const char* msg = "?";
    cuptiGetResultString(r, &msg);
    std::fprintf(stderr, "graphsafe-cupti: cannot enable CUPTI callbacks (%s)\n", msg);
    cuptiUnsubscribe(S.subscriber);
    S.subscriber = nullptr;
    return false;
  }
  S.enabled = true;
  if (!S.atexit_registered) {
    std::atexit(&at_exit);
    S.atexit_registered = true;
  }
  if (!std::getenv("GRAPHSAFE_CUPTI_QUIET"))
    std::fprintf(stderr, "graphsafe-cupti: watching CUDA API calls during stream capture (report at exit: %s)\n",
                 report_path_impl().c_str());
  return true;
}

void disable() {
  State& S = st();
  std::lock_guard g(S.mu);
  if (!S.enabled) return;
  InTool guard;
  cuptiUnsubscribe(S.subscriber);
  S.subscriber = nullptr;
  S.enabled = false;
}

bool enabled() {
  std::lock_guard g(st().mu);
  return st().enabled;
}

std::vector<Finding> findings(bool include_notes) {
  std::lock_guard g(st().mu);
  std::vector<Finding> out;
  for (const auto& f : st().findings)
    if (include_notes || f.severity != "note") out.push_back(f);
  return out;
}

std::size_t finding_count() {
  std::lock_guard g(st().mu);
  std::size_t n = 0;
  for (const auto& f : st().findings) n += f.severity != "note";
  return n;
}

void clear() {
  std::lock_guard g(st().mu);
  State& S = st();
  S.findings.clear();
  S.printed.clear();
  S.dedup.clear();
  for (auto& [k, c] : S.captures) c.findings.clear();
}

bool write_report(const std::string& path) { return write_report_impl(path); }
std::string report_path() { return report_path_impl(); }

void report_external(const std::string& kind, const std::string& what, const std::string& site,
                     const std::string& reason, const std::string& severity) {
  Finding f;
  f.severity = severity;
  f.kind = kind;
  f.api = what;
  f.site = site;
  f.reason = reason;
  f.thread = tid();
  f.backtrace = {site};
  std::lock_guard g(st().mu);
  add_finding_locked(std::move(f), nullptr, true);
}

}  // namespace graphsafe::cupti

extern "C" {

__attribute__((visibility("default"))) int InitializeInjection(void) {
  return graphsafe::cupti::enable() ? 1 : 0;
}

__attribute__((visibility("default"))) int graphsafe_cupti_enable(void) { return graphsafe::cupti::enable() ? 1 : 0; }

__attribute__((visibility("default"))) unsigned long long graphsafe_cupti_finding_count(void) {
  return graphsafe::cupti::finding_count();
}

__attribute__((visibility("default"))) int graphsafe_cupti_write_report(const char* path) {
  return graphsafe::cupti::write_report(path ? path : "") ? 1 : 0;
}
}
