// The arena as PyTorch's allocator: two C symbols with the signatures of
// torch.cuda.memory.CUDAPluggableAllocator, exported from this extension module, so a
// torch.cuda.MemPool built over them takes its segments from a graphsafe arena
// (graphsafe.torch_mem_pool, python/graphsafe/_torch_allocator.py).
//
// One arena serves each device (a registry keyed by device; -1 is the host backend, which only the
// tests call, through ctypes). A segment torch asks for while the stream is capturing through
// graphsafe (an arena capture on TorchCudaBackend) is an opaque request of that capture: placed in
// the family's region, in the plan and the debug report with the Python line that made torch
// allocate, and the graph's for as long as the graph lives (torch's later free of it is a no-op).
// Outside a graphsafe capture a segment is an eager block, returned stream-ordered on free. A
// segment asked for while torch itself captures (torch.cuda.graph(pool=...)) is taken eagerly on a
// side stream in relaxed capture mode, so neither a slab allocation nor a stream dependency lands in
// torch's graph; torch's pool keeps it for the graph, as it keeps its own segments.
#include "common.hpp"

#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <Python.h>
#include <frameobject.h>
#include <cuda_runtime_api.h>
#include <sys/types.h>

#include <algorithm>
#include <bit>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

namespace graphsafe::python {
namespace {

using namespace nb::literals;

struct Segment {
  std::uint64_t bytes = 0;
  bool captured = false;  // served inside a graphsafe capture: the graph's, never freed by torch
  void* stream = nullptr;
  std::string site;       // innermost Python frame outside torch and graphsafe: "file:line (function)"
  std::string traceback;  // the Python stack, innermost first, "file:line in function" per frame
};

struct Served {
  nb::object arena_obj;  // keeps the arena alive while it is registered
  Arena* arena = nullptr;
  int device = -1;
  bool sites = true;
  std::vector<std::string> skip;  // set at registration, read-only after
  cudaStream_t side = nullptr;  // eager segments asked for while torch captures
  std::map<std::uintptr_t, Segment> live;
  std::uint64_t allocs = 0, frees = 0, captured_allocs = 0, eager_allocs = 0, external_capture_allocs = 0;
  std::uint64_t bytes_in_use = 0, peak_bytes = 0, captured_bytes = 0, failures = 0;
  std::string last_error;
};

std::mutex registry_mutex;
// Leaked: the symbols may be called by torch while the interpreter shuts down.
auto& registry = *new std::map<int, std::shared_ptr<Served>>();

std::shared_ptr<Served> served_for(int device) {
  std::lock_guard g(registry_mutex);
  auto it = registry.find(device);
  return it == registry.end() ? nullptr : it->second;
}

// Frames of these files (prefixes: torch's and graphsafe's package folders, contextlib) are not the
// site: the site is the caller's line that made torch allocate.
bool skipped_frame(const std::vector<std::string>& skip, const char* file) {
  const std::string_view f = file;
  if (f.starts_with("<frozen")) return true;
  for (const std::string& p : skip)
    if (f.starts_with(p)) return true;
  return false;
}

// The Python stack of the calling thread (GIL held): fills the site and traceback of `seg`.
void python_site(const std::vector<std::string>& skip, Segment& seg, unsigned& line, std::string& file,
                 std::string& function) {
  PyFrameObject* f = PyEval_GetFrame();  // borrowed
  if (!f) return;
  nb::object frame = nb::borrow(reinterpret_cast<PyObject*>(f));
  int depth = 0;
  bool found = false;
  while (frame.is_valid() && depth < 16) {
    auto* fo = reinterpret_cast<PyFrameObject*>(frame.ptr());
    nb::object code = nb::steal(reinterpret_cast<PyObject*>(PyFrame_GetCode(fo)));
    auto* co = reinterpret_cast<PyCodeObject*>(code.ptr());
    const char* fl = PyUnicode_AsUTF8(co->co_filename);
    const char* fn = PyUnicode_AsUTF8(co->co_name);
    if (!fl || !fn) {
      PyErr_Clear();
      break;
    }
    const int ln = PyFrame_GetLineNumber(fo);
    if (!seg.traceback.empty()) seg.traceback += " <- ";
    seg.traceback += std::string(fl) + ":" + std::to_string(ln) + " in " + fn;
    if (!found && !skipped_frame(skip, fl)) {
      found = true;
      file = fl;
      function = fn;
      line = static_cast<unsigned>(ln);
    }
    PyFrameObject* back = PyFrame_GetBack(fo);  // new reference or null
    frame = back ? nb::steal(reinterpret_cast<PyObject*>(back)) : nb::object();
    ++depth;
  }
}

// std::source_location over our own strings (the layout GCC and Clang fill; see PythonSite).
struct SiteRecord {
  const char* file;
  const char* function;
  unsigned line;
  unsigned column;
};

void fail(Served& s, const std::string& message) {
  ++s.failures;
  s.last_error = message;
}

// The Python call site of an allocation, taken before any lock: the GIL is never waited for while
// the registry's lock is held (a thread holding the GIL may be waiting for that lock).
struct CallSite {
  Segment seg;
  unsigned line = 0;
  std::string file = "<torch>", function = "<no Python frame>";
};

CallSite call_site(const Served& s) {
  CallSite c;
  if (s.sites && Py_IsInitialized()) {
    // torch calls the allocator with the GIL released; the thread's frames are still there.
    PyGILState_STATE st = PyGILState_Ensure();
    python_site(s.skip, c.seg, c.line, c.file, c.function);
    PyGILState_Release(st);
  }
  return c;
}

void* allocate(Served& s, std::size_t size, int device, void* stream, CallSite&& c) {
  if (device != s.device)
    throw invalid_argument_error("graphsafe: torch asked for a segment on device " + std::to_string(device) +
                                 " from the allocator of device " + std::to_string(s.device) +
                                 "; make a pool with graphsafe.torch_mem_pool(arena) for each device");
  Segment seg = std::move(c.seg);
  seg.bytes = size;
  seg.stream = stream;
  const unsigned line = c.line;
  const std::string& file = c.file;
  const std::string& function = c.function;
  SiteRecord rec{file.c_str(), function.c_str(), line, 0};
  static_assert(sizeof(std::source_location) == sizeof(const SiteRecord*));
  const std::source_location loc = std::bit_cast<std::source_location>(&rec);
  seg.site = file.substr(file.find_last_of('/') == std::string::npos ? 0 : file.find_last_of('/') + 1) + ":" +
             std::to_string(line) + " (" + function + ")";

  Arena& a = *s.arena;
  Stream st = device < 0 ? (stream ? Stream(static_cast<cudaStream_t>(stream)) : Stream(default_host_stream()))
                         : Stream(static_cast<cudaStream_t>(stream));
  void* p = nullptr;
  const bool capturing = a.backend().capture_info(st).active;
  if (capturing && a.stats().active_captures > 0) {
    // A graphsafe capture on this stream records it (one on another stream refuses it: torch's own
    // capture while graphsafe captures elsewhere).
    p = a.allocate(st, size, kAlignment, loc);
    seg.captured = true;
  } else if (capturing) {
    // torch.cuda.graph's capture: take the block on the side stream, outside the capture.
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    cudaThreadExchangeStreamCaptureMode(&mode);
    try {
      if (!s.side) GRAPHSAFE_CUDA(cudaStreamCreateWithFlags(&s.side, cudaStreamNonBlocking));
      p = a.allocate(Stream(s.side), size, kAlignment, loc);
      GRAPHSAFE_CUDA(cudaStreamSynchronize(s.side));
    } catch (...) {
      cudaThreadExchangeStreamCaptureMode(&mode);
      throw;
    }
    cudaThreadExchangeStreamCaptureMode(&mode);
    seg.stream = s.side;
    ++s.external_capture_allocs;
  } else {
    p = a.allocate(st, size, kAlignment, loc);
  }
  ++s.allocs;
  if (seg.captured) {
    ++s.captured_allocs;
    s.captured_bytes += size;
  } else {
    ++s.eager_allocs;
  }
  s.bytes_in_use += size;
  s.peak_bytes = std::max(s.peak_bytes, s.bytes_in_use);
  s.live[reinterpret_cast<std::uintptr_t>(p)] = std::move(seg);
  return p;
}

void release(Served& s, void* ptr) {
  auto it = s.live.find(reinterpret_cast<std::uintptr_t>(ptr));
  if (it == s.live.end())
    throw invalid_argument_error("graphsafe: torch freed " + std::to_string(reinterpret_cast<std::uintptr_t>(ptr)) +
                                 ", which this allocator did not serve (or freed twice)");
  Segment seg = std::move(it->second);
  s.live.erase(it);
  ++s.frees;
  s.bytes_in_use -= seg.bytes;
  Stream st = s.device < 0 ? (seg.stream ? Stream(static_cast<cudaStream_t>(seg.stream)) : Stream(default_host_stream()))
                           : Stream(static_cast<cudaStream_t>(seg.stream));
  if (seg.captured) {
    s.captured_bytes -= seg.bytes;
    // Freed while its capture runs: the capture's later requests may reuse the range. Freed after:
    // the graph owns the range and graphsafe gives it back when the graph dies.
    if (s.arena->stats().active_captures > 0) {
      try {
        s.arena->deallocate(st, ptr, seg.bytes);
      } catch (const invalid_argument_error&) {
        // A finished graph's segment, freed while another capture runs: still the graph's.
      }
    }
    return;
  }
  s.arena->deallocate(st, ptr, seg.bytes);
}

nb::dict stats_of(const Served& s) {
  nb::dict d;
  d["device"] = s.device;
  d["allocs"] = s.allocs;
  d["frees"] = s.frees;
  d["captured_allocs"] = s.captured_allocs;
  d["eager_allocs"] = s.eager_allocs;
  d["external_capture_allocs"] = s.external_capture_allocs;
  d["bytes_in_use"] = s.bytes_in_use;
  d["peak_bytes"] = s.peak_bytes;
  d["captured_bytes"] = s.captured_bytes;
  d["failures"] = s.failures;
  d["last_error"] = s.last_error;
  nb::list segs;
  for (const auto& [ptr, seg] : s.live) {
    nb::dict e;
    e["ptr"] = ptr;
    e["bytes"] = seg.bytes;
    e["captured"] = seg.captured;
    e["site"] = seg.site;
    e["traceback"] = seg.traceback;
    segs.append(e);
  }
  d["segments"] = segs;
  return d;
}

}  // namespace

bool torch_allocator_serves(const Backend& b) {
  std::lock_guard g(registry_mutex);
  for (auto& [dev, s] : registry)
    if (&s->arena->backend() == &b) return true;
  return false;
}

void bind_torch_allocator(nb::module_& m) {
  m.def(
      "_torch_allocator_register",
      [](nb::handle arena, bool sites, std::vector<std::string> skip) {
        Arena& a = nb::cast<Arena&>(arena);
        const int device = cuda_device_of(a.backend());
        std::lock_guard g(registry_mutex);
        auto& slot = registry[device];
        if (slot && slot->arena != &a && slot->bytes_in_use > 0)
          throw capture_state_error("graphsafe: device " + std::to_string(device) + "'s torch allocator serves another arena, " +
                                    "which torch still holds " + std::to_string(slot->bytes_in_use) + " bytes of (" +
                                    std::to_string(slot->live.size()) +
                                    " segment(s)); drop its pools and graphs first (one arena serves torch per device)");
        if (!slot || slot->arena != &a) {
          auto s = std::make_shared<Served>();
          s->arena_obj = nb::borrow(arena);
          s->arena = &a;
          s->device = device;
          if (slot) s->side = slot->side;  // one side stream per device
          s->sites = sites;
          s->skip = std::move(skip);
          slot = s;
        }
        return device;
      },
      "arena"_a, "sites"_a = true, "skip"_a = std::vector<std::string>{},
      "Make `arena` the one the exported torch allocator symbols serve on its device; returns the device. "
      "`skip`: file prefixes whose frames are not a segment's site (torch's and graphsafe's own)");
  m.def(
      "torch_allocator_stats",
      [](nb::handle device) -> nb::object {
        if (device.is_none()) {
          nb::dict all;
          std::lock_guard g(registry_mutex);
          for (auto& [dev, s] : registry) all[nb::int_(dev)] = stats_of(*s);
          return all;
        }
        const int dev = nb::cast<int>(device);
        auto s = served_for(dev);
        if (!s) throw invalid_argument_error("graphsafe: no arena serves torch on device " + std::to_string(dev) +
                                             "; make one with graphsafe.torch_mem_pool(arena)");
        std::lock_guard g(registry_mutex);
        return stats_of(*s);
      },
      nb::arg("device").none() = nb::none(),
      "What the torch allocator served on `device` (all devices, by device, when None): counts, bytes in use, "
      "peak, failures with the last error, and each live segment with the Python line that made torch allocate it");
}

}  // namespace graphsafe::python

// torch.cuda.memory.CUDAPluggableAllocator's symbols. No exception crosses into torch: a failure
// returns nullptr (torch raises its out-of-memory error) and is recorded in torch_allocator_stats.
extern "C" __attribute__((visibility("default"))) void* graphsafe_torch_alloc(ssize_t size, int device,
                                                                              cudaStream_t stream) {
  using namespace graphsafe::python;
  auto s = served_for(device);
  if (!s) return nullptr;
  CallSite site = call_site(*s);
  std::lock_guard g(registry_mutex);
  try {
    if (size < 0) throw graphsafe::invalid_argument_error("graphsafe: torch asked for " + std::to_string(size) + " bytes");
    return allocate(*s, static_cast<std::size_t>(size), device, static_cast<void*>(stream), std::move(site));
  } catch (const std::exception& e) {
    fail(*s, e.what());
  } catch (...) {
    fail(*s, "graphsafe: unknown error");
  }
  return nullptr;
}

extern "C" __attribute__((visibility("default"))) void graphsafe_torch_free(void* ptr, ssize_t, int device,
                                                                            cudaStream_t) {
  using namespace graphsafe::python;
  if (!ptr) return;
  auto s = served_for(device);
  if (!s) return;
  std::lock_guard g(registry_mutex);
  try {
    release(*s, ptr);
  } catch (const std::exception& e) {
    fail(*s, e.what());
  } catch (...) {
    fail(*s, "graphsafe: unknown error");
  }
}
