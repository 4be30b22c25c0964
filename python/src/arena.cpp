// Backends, streams, the arena, workspaces (with DLPack export), capture and replay.
#include "common.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/stl/function.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cuda_runtime_api.h>

#include <chrono>
#include <memory>
#include <optional>

namespace graphsafe::python {

namespace {

using namespace nb::literals;

// A Python callable shared with C++ closures that may be copied, run or dropped on any thread:
// every touch of the Python object holds the GIL.
std::shared_ptr<nb::object> share(nb::handle fn) {
  return std::shared_ptr<nb::object>(new nb::object(nb::borrow(fn)), [](nb::object* p) {
    nb::gil_scoped_acquire gil;
    delete p;
  });
}

// A workspace handle as Python sees it. `exports` counts live DLPack views (tensors, arrays):
// release() refuses while one lives, so no tensor outlives the memory under it.
struct PyWorkspace {
  nb::object arena;  // the workspace's memory lives in this arena: keep it alive
  Workspace ws;
  std::string name;
  std::uint64_t element_bytes = 1;
  int device_type = 1;  // kDLCPU; kDLCUDA = 2
  int device_id = 0;
  int exports = 0;
  void* stream = nullptr;  // the stream it was requested on (its memory is ready there)

  void release() {
    if (exports > 0)
      throw capture_state_error("graphsafe: workspace '" + name + "' has " + std::to_string(exports) +
                                " live tensor/array view(s); drop them before release() (the memory would be reused "
                                "under them), or let the workspace go when the last view dies");
    ws.reset();
  }
};

nb::dict stats_dict(const ArenaStats& s) {
  nb::dict d;
  d["slab_bytes"] = s.slab_bytes;
  d["slabs"] = s.slabs;
  d["free_bytes"] = s.free_bytes;
  d["largest_free"] = s.largest_free;
  d["eager_bytes"] = s.eager_bytes;
  d["eager_blocks"] = s.eager_blocks;
  d["region_bytes"] = s.region_bytes;
  d["families"] = s.families;
  d["live_graphs"] = s.live_graphs;
  d["active_captures"] = s.active_captures;
  return d;
}

const char* entry_kind(PlanEntry::Kind k) {
  switch (k) {
    case PlanEntry::Kind::workspace: return "workspace";
    case PlanEntry::Kind::dimension: return "dimension";
    case PlanEntry::Kind::opaque: return "opaque";
  }
  return "?";
}

nb::dict entry_dict(const PlanEntry& e) {
  nb::dict d;
  d["kind"] = entry_kind(e.kind);
  d["name"] = e.name;
  d["policy"] = e.policy;
  d["need"] = e.need ? nb::cast(*e.need) : nb::none();
  d["needed_at_capture"] = e.needed_at_capture;
  d["reserved"] = e.reserved;
  d["element_bytes"] = e.element_bytes;
  d["bytes"] = e.bytes;
  d["offset"] = e.offset;
  d["replay_safe"] = e.replay_safe;
  d["note"] = e.note;
  d["site"] = e.site;
  return d;
}

// Mean nanoseconds of `fn` over `iterations` calls (GIL released: nothing here touches Python).
template <class Fn>
double loop_ns(int iterations, Fn&& fn) {
  if (iterations <= 0) throw invalid_argument_error("graphsafe: iterations must be > 0, got " + std::to_string(iterations));
  nb::gil_scoped_release nogil;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < iterations; ++i) fn();
  const auto t1 = std::chrono::steady_clock::now();
  return std::chrono::duration<double, std::nano>(t1 - t0).count() / iterations;
}

CaptureMode mode_of(const std::string& m) {
  if (m == "global") return CaptureMode::global;
  if (m == "thread_local") return CaptureMode::thread_local_mode;
  if (m == "relaxed") return CaptureMode::relaxed;
  throw invalid_argument_error("graphsafe: capture mode '" + m + "' is not one of 'global', 'thread_local', 'relaxed'");
}

CaptureOptions capture_options(std::optional<CaptureFamily> family, const std::string& mode, nb::handle recapture) {
  CaptureOptions o;
  o.family = std::move(family);
  o.mode = mode_of(mode);
  if (!recapture.is_none()) {
    auto fn = share(recapture);
    o.recapture = [fn](const Bindings& refused) -> std::optional<Bindings> {
      nb::gil_scoped_acquire gil;
      nb::object r = (*fn)(nb::cast(refused, nb::rv_policy::copy));
      if (r.is_none()) return std::nullopt;
      return to_bindings(r);
    };
  }
  return o;
}

// A captured graph and the arena it came from (kept alive: the graph's region lives in it).
// `arena` comes first so it is released last: the graph's destructor returns its region to the
// arena and destroys its executable graph through the arena's backend.
struct PyGraph {
  nb::object arena;
  CapturedGraph graph;
};

// `with arena.capture(bindings) as cap:` ... `cap.graph`. The session starts at __enter__ and
// ends at __exit__: finish() when the block succeeded, abandoned (capture ended, everything
// released) when it raised.
struct PyCapture {
  nb::object arena_obj;
  Arena* arena;
  nb::object stream_obj;
  Bindings bindings;
  CaptureOptions opts;
  std::unique_ptr<CaptureSession> session;
  std::optional<nb::object> graph;
};

}  // namespace

void bind_arena(nb::module_& m) {
  nb::class_<Backend>(m, "Backend", "Memory, capture state and graph launch under an arena.")
      .def_prop_ro("name", [](const Backend& b) { return std::string(b.name()); })
      .def("synchronize", [](Backend& b, nb::handle s) {
        Stream st = to_stream(b, s);
        nb::gil_scoped_release nogil;
        b.synchronize(st);
      }, nb::arg("stream").none() = nb::none());

  nb::class_<HostStream>(m, "HostStream",
                         "An in-order host stream: launch(fn) runs fn now, or records it while the stream is "
                         "capturing, to run at every replay (arguments frozen at capture, as in a CUDA graph).")
      .def(nb::init<>())
      .def("launch",
           [](HostStream& s, nb::callable fn) {
             auto f = share(fn);
             s.launch([f] {
               nb::gil_scoped_acquire gil;
               (*f)();
             });
           },
           "fn"_a)
      .def_prop_ro("capturing", &HostStream::capturing);
  m.def("default_host_stream", &default_host_stream, nb::rv_policy::reference,
        "The HostStream used when a host-backend call gets stream=None");

  nb::class_<HostBackend, Backend>(m, "HostBackend",
                                   "The arena's logic on the CPU: host memory and recorded host graphs (CI, tests)")
      .def("__init__", [](HostBackend* self, std::uint64_t limit_bytes) {
        new (self) HostBackend(HostBackendOptions{.limit_bytes = limit_bytes});
      }, "limit_bytes"_a = 0)
      .def_prop_ro("bytes_in_use", &HostBackend::bytes_in_use)
      .def_prop_ro("slab_allocations", &HostBackend::slab_allocations);

  nb::class_<CudaBackend, Backend>(m, "CudaBackend",
                                   "Slabs from a private cudaMemPool_t, capture through cudaStreamBeginCapture")
      .def("__init__",
           [](CudaBackend* self, int device, std::optional<std::uint64_t> release_threshold, std::uint64_t pool_max_bytes,
              std::optional<bool> plain_allocations) {
             CudaBackendOptions o;
             o.device = device;
             if (release_threshold) o.release_threshold = *release_threshold;
             o.pool_max_bytes = pool_max_bytes;
             if (plain_allocations) o.plain_allocations = *plain_allocations;
             new (self) CudaBackend(o);
           },
           "device"_a = -1, nb::arg("release_threshold").none() = nb::none(), "pool_max_bytes"_a = 0,
           nb::arg("plain_allocations").none() = nb::none())
      .def_prop_ro("device", &CudaBackend::device);
  m.def("cuda_device_count", [] {
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
      cudaGetLastError();
      return 0;
    }
    return n;
  }, "CUDA devices visible to the process (0 without a driver or a device)");

  nb::class_<ArenaOptions>(m, "ArenaOptions", "Arena options (see include/graphsafe/arena.hpp)")
      .def("__init__",
           [](ArenaOptions* self, std::uint64_t growth_bytes, bool grow_on_demand, bool refuse_unsafe_capture,
              bool report_findings, bool always_check_capture, std::optional<bool> debug, std::uint64_t canary_bytes,
              bool canaries, std::uint32_t canary_check_every, bool nvtx) {
             new (self) ArenaOptions();
             self->growth_bytes = growth_bytes;
             self->grow_on_demand = grow_on_demand;
             self->refuse_unsafe_capture = refuse_unsafe_capture;
             self->report_findings = report_findings;
             self->always_check_capture = always_check_capture;
             if (debug) self->debug = *debug;
             self->canary_bytes = canary_bytes;
             self->canaries = canaries;
             self->canary_check_every = canary_check_every;
             self->nvtx = nvtx;
           },
           "growth_bytes"_a = ArenaOptions{}.growth_bytes, "grow_on_demand"_a = true, "refuse_unsafe_capture"_a = false,
           "report_findings"_a = true, "always_check_capture"_a = false, nb::arg("debug").none() = nb::none(),
           "canary_bytes"_a = ArenaOptions{}.canary_bytes, "canaries"_a = true, "canary_check_every"_a = 1u,
           "nvtx"_a = true)
      .def_rw("growth_bytes", &ArenaOptions::growth_bytes)
      .def_rw("grow_on_demand", &ArenaOptions::grow_on_demand)
      .def_rw("refuse_unsafe_capture", &ArenaOptions::refuse_unsafe_capture)
      .def_rw("report_findings", &ArenaOptions::report_findings)
      .def_rw("always_check_capture", &ArenaOptions::always_check_capture)
      .def_rw("debug", &ArenaOptions::debug)
      .def_rw("canary_bytes", &ArenaOptions::canary_bytes)
      .def_rw("canaries", &ArenaOptions::canaries)
      .def_rw("canary_check_every", &ArenaOptions::canary_check_every)
      .def_rw("nvtx", &ArenaOptions::nvtx);

  nb::class_<CaptureFamily>(m, "CaptureFamily",
                            "Graphs replayed one at a time on one stream, sharing one region sized by their largest plan")
      .def_prop_ro("name", &CaptureFamily::name)
      .def_prop_ro("region_bytes", &CaptureFamily::region_bytes)
      .def_prop_ro("graphs", &CaptureFamily::graphs)
      .def_prop_ro("largest_plan_bytes", &CaptureFamily::largest_plan_bytes)
      .def_prop_ro("sum_of_plan_bytes", &CaptureFamily::sum_of_plan_bytes)
      .def("__repr__", [](const CaptureFamily& f) {
        return "CaptureFamily('" + f.name() + "', graphs=" + std::to_string(f.graphs()) +
               ", region_bytes=" + std::to_string(f.region_bytes()) + ")";
      });

  nb::class_<PyWorkspace>(m, "Workspace",
                          "Memory the arena served. Eager workspaces return to the arena (stream-ordered) on "
                          "release() or when garbage; captured ones belong to their graph. Exports DLPack "
                          "(torch.from_dlpack, numpy.from_dlpack) without a copy.")
      .def_prop_ro("ptr", [](const PyWorkspace& w) { return reinterpret_cast<std::uintptr_t>(w.ws.data()); })
      .def_prop_ro("bytes", [](const PyWorkspace& w) { return w.ws.bytes(); })
      .def_prop_ro("count", [](const PyWorkspace& w) { return w.ws.count(); },
                   "Elements reserved by the policy (not the current need): lay the workspace out with this")
      .def_prop_ro("captured", [](const PyWorkspace& w) { return w.ws.captured(); })
      .def_prop_ro("name", [](const PyWorkspace& w) { return w.name; })
      .def_prop_ro("element_bytes", [](const PyWorkspace& w) { return w.element_bytes; })
      .def_prop_ro("device", [](const PyWorkspace& w) { return w.device_type == 2 ? w.device_id : -1; },
                   "CUDA device index, -1 for host memory")
      .def_prop_ro("live_views", [](const PyWorkspace& w) { return w.exports; })
      .def("release", &PyWorkspace::release, "Give the memory back now (stream-ordered; no-op when captured)")
      .def("__bool__", [](const PyWorkspace& w) { return static_cast<bool>(w.ws); })
      .def("__enter__", [](nb::handle self) { return nb::borrow(self); })
      .def("__exit__", [](PyWorkspace& w, nb::args) { w.release(); })
      .def("__dlpack_device__", [](const PyWorkspace& w) { return nb::make_tuple(w.device_type, w.device_id); })
      .def("__dlpack__",
           [](nb::handle self, nb::kwargs kw) {
             PyWorkspace& w = nb::cast<PyWorkspace&>(self);
             if (!w.ws)
               throw capture_state_error("graphsafe: workspace '" + w.name + "' was released; it has no memory to export");
             // DLPack's stream protocol: the consumer names the stream it will use the memory on
             // (1: the legacy default stream, 2: per-thread default, -1: no synchronization); order it
             // after the workspace's stream, where the memory became this workspace's.
             if (w.device_type == 2 && kw.contains("stream") && !kw["stream"].is_none()) {
               const std::intptr_t consumer = nb::cast<std::intptr_t>(kw["stream"]);
               cudaStream_t c = consumer == 1   ? cudaStreamLegacy
                                : consumer == 2 ? cudaStreamPerThread
                                                : reinterpret_cast<cudaStream_t>(consumer);
               if (consumer != -1 && c != static_cast<cudaStream_t>(w.stream))
                 nb::cast<Arena&>(w.arena).backend().order_after(Stream(c), Stream(static_cast<cudaStream_t>(w.stream)));
             }
             // The view owns a reference to the workspace and counts itself in `exports`.
             self.inc_ref();
             ++w.exports;
             nb::capsule owner(self.ptr(), [](void* p) noexcept {
               auto* o = static_cast<PyObject*>(p);
               --nb::inst_ptr<PyWorkspace>(nb::handle(o))->exports;
               Py_DECREF(o);
             });
             std::size_t shape[1] = {static_cast<std::size_t>(w.ws.bytes())};
             nb::ndarray<nb::array_api, std::uint8_t, nb::ndim<1>> a(w.ws.data(), 1, shape, owner, nullptr, nb::dtype<std::uint8_t>(),
                                                      w.device_type, w.device_id);
             nb::object arr = nb::cast(a, nb::rv_policy::reference);
             return arr.attr("__dlpack__")(**kw);
           })
      .def("__repr__", [](const PyWorkspace& w) {
        return "Workspace('" + w.name + "', bytes=" + std::to_string(w.ws.bytes()) + ", count=" +
               std::to_string(w.ws.count()) + (w.ws.captured() ? ", captured" : "") + ")";
      });

  nb::class_<Plan>(m, "Plan", "What a capture reserved, and the guards replays must pass")
      .def_prop_ro("entries", [](const Plan& p) {
        nb::list l;
        for (const PlanEntry& e : p.entries()) l.append(entry_dict(e));
        return l;
      })
      .def_prop_ro("findings", [](const Plan& p) {
        nb::list l;
        for (const CaptureFinding& f : p.findings()) {
          nb::dict d;
          d["request"] = f.request;
          d["site"] = f.site;
          d["message"] = f.message;
          l.append(d);
        }
        return l;
      })
      .def_prop_ro("captured_bindings", [](const Plan& p) { return Bindings(p.captured_bindings()); })
      .def_prop_ro("bytes", &Plan::bytes)
      .def_prop_ro("guard_count", &Plan::guard_count)
      .def_prop_ro("symbols", &Plan::symbols)
      .def("check", [](const Plan& p, nb::handle b) { return p.check(to_bindings(b)); }, "bindings"_a,
           "The guard violations for these bindings (empty: a replay with them is safe)")
      .def("enforce", [](const Plan& p, nb::handle b) { p.enforce(to_bindings(b)); }, "bindings"_a)
      .def("report", &Plan::report);

  nb::class_<PyGraph>(m, "CapturedGraph",
                      "A captured graph: replay(bindings) checks its guards, then launches. A replay the graph "
                      "cannot serve raises GuardFailure before launch (or re-captures, when asked to).")
      .def("replay",
           [](PyGraph& g, nb::handle b, nb::handle s) {
             Bindings storage;
             const Bindings& bb = bindings_arg(b, storage);
             Stream st = to_stream(nb::cast<Arena&>(g.arena).backend(), s);
             PythonSite site;
             nb::gil_scoped_release nogil;
             g.graph.replay(bb, st, site.loc());
           },
           "bindings"_a, nb::arg("stream").none() = nb::none())
      .def("replay_unguarded_for_testing",
           [](PyGraph& g, nb::handle s) {
             Stream st = to_stream(nb::cast<Arena&>(g.arena).backend(), s);
             nb::gil_scoped_release nogil;
             g.graph.replay_unguarded_for_testing(st);
           },
           nb::arg("stream").none() = nb::none(), "Launch without the guards: only for showing what they prevent")
      .def("check", [](const PyGraph& g, nb::handle b) { return g.graph.plan().check(to_bindings(b)); }, "bindings"_a)
      .def_prop_ro("plan", [](const PyGraph& g) -> const Plan& { return g.graph.plan(); }, nb::rv_policy::reference_internal)
      .def_prop_ro("reserved_bytes", [](const PyGraph& g) { return g.graph.reserved_bytes(); })
      .def_prop_ro("recaptures", [](const PyGraph& g) { return g.graph.recaptures(); })
      .def_prop_ro("family", [](const PyGraph& g) { return g.graph.family(); })
      .def("_replay_loop_ns",
           [](PyGraph& g, nb::handle b, nb::handle s, int iterations) {
             Bindings storage;
             const Bindings& bb = bindings_arg(b, storage);
             Stream st = to_stream(nb::cast<Arena&>(g.arena).backend(), s);
             return loop_ns(iterations, [&] { g.graph.replay(bb, st); });
           },
           "bindings"_a, nb::arg("stream").none(), "iterations"_a,
           "Benchmark baseline: mean ns of `iterations` guarded replays looped in C++");

  nb::class_<PyCapture>(m, "Capture", "Context manager from Arena.capture(); `graph` is set when the block ends")
      .def("__enter__",
           [](nb::handle self) {
             PyCapture& c = nb::cast<PyCapture&>(self);
             if (c.session || c.graph) throw capture_state_error("graphsafe: a Capture is entered once");
             c.session = std::make_unique<CaptureSession>(*c.arena, to_stream(c.arena->backend(), c.stream_obj),
                                                          c.bindings, c.opts);
             return nb::borrow(self);
           })
      .def("__exit__",
           [](PyCapture& c, nb::args exc) {
             nb::handle type = exc.size() ? exc[0] : nb::none();
             std::unique_ptr<CaptureSession> s = std::move(c.session);
             if (!s) return false;
             if (!type.is_none()) return false;  // the session's destructor abandons the capture
             CapturedGraph g = s->finish();
             c.graph = nb::cast(PyGraph{c.arena_obj, std::move(g)});
             return false;
           })
      .def_prop_ro("graph", [](const PyCapture& c) -> nb::object {
        if (!c.graph) throw capture_state_error("graphsafe: the capture has not finished (use `graph` after the with block)");
        return *c.graph;
      })
      .def_prop_ro("plan", [](const PyCapture& c) -> const Plan& {
        if (!c.session) throw capture_state_error("graphsafe: no capture under way (plan is readable inside the with block; after it, use graph.plan)");
        return c.session->plan();
      }, nb::rv_policy::reference_internal)
      .def_prop_ro("bindings", [](const PyCapture& c) { return c.bindings; });

  nb::class_<Arena>(m, "Arena",
                    "The graph-safe workspace allocator over a backend: reserve before capture, request workspaces "
                    "sized by an Extent and a policy, capture graphs that keep their workspaces reserved.")
      .def(nb::init<Backend&, ArenaOptions>(), "backend"_a, "options"_a = ArenaOptions(), nb::keep_alive<1, 2>())
      .def("reserve",
           [](Arena& a, std::uint64_t bytes, nb::handle s) { a.reserve(bytes, to_stream(a.backend(), s)); },
           "bytes"_a, nb::arg("stream").none() = nb::none())
      .def("request",
           [](nb::handle self, const std::string& name, const Extent& need, const SizingPolicy& policy,
              nb::handle bindings, std::uint64_t element_bytes, nb::handle stream) {
             Arena& a = nb::cast<Arena&>(self);
             Stream s = to_stream(a.backend(), stream);
             Bindings storage;
             const Bindings& b = bindings_arg(bindings, storage);
             PythonSite site;
             PyWorkspace w;
             w.arena = nb::borrow(self);
             w.ws = a.request(s, name, need, element_bytes, policy, b, site.loc());
             w.name = name;
             w.element_bytes = element_bytes;
             w.stream = s.handle();
             const int dev = cuda_device_of(a.backend());
             w.device_type = dev < 0 ? 1 : 2;
             w.device_id = dev < 0 ? 0 : dev;
             return w;
           },
           "name"_a, "need"_a, "policy"_a = m.attr("capacity_bound"), nb::arg("bindings").none() = nb::none(), "element_bytes"_a = 1,
           nb::arg("stream").none() = nb::none(),
           "A workspace of policy.size(need) elements of element_bytes each (the call site is this Python line)")
      .def("dimension",
           [](Arena& a, const std::string& name, const Extent& need, const SizingPolicy& policy, nb::handle bindings,
              nb::handle stream) {
             PythonSite site;
             Bindings storage;
             return a.dimension(to_stream(a.backend(), stream), name, need, policy, bindings_arg(bindings, storage),
                                site.loc());
           },
           "name"_a, "need"_a, "policy"_a = m.attr("capacity_bound"), nb::arg("bindings").none() = nb::none(), nb::arg("stream").none() = nb::none(),
           "A sized element count a graph freezes without allocating (a stride, an offset), guarded like a request")
      .def("allocate",
           [](Arena& a, std::uint64_t bytes, std::uint64_t alignment, nb::handle stream) {
             PythonSite site;
             return reinterpret_cast<std::uintptr_t>(a.allocate(to_stream(a.backend(), stream), bytes, alignment, site.loc()));
           },
           "bytes"_a, "alignment"_a = kAlignment, nb::arg("stream").none() = nb::none(), "An opaque byte request; returns the address")
      .def("deallocate",
           [](Arena& a, std::uintptr_t ptr, std::uint64_t bytes, nb::handle stream) {
             a.deallocate(to_stream(a.backend(), stream), reinterpret_cast<void*>(ptr), bytes);
           },
           "ptr"_a, "bytes"_a, nb::arg("stream").none() = nb::none())
      .def("family", &Arena::family, "name"_a)
      .def("_request_release_loop_ns",
           [](Arena& a, const Extent& need, const SizingPolicy& policy, nb::handle bindings, std::uint64_t element_bytes,
              nb::handle stream, int iterations) {
             Stream s = to_stream(a.backend(), stream);
             Bindings b = to_bindings(bindings);
             return loop_ns(iterations, [&] { a.request(s, "bench", need, element_bytes, policy, b).reset(); });
           },
           "need"_a, "policy"_a, nb::arg("bindings").none(), "element_bytes"_a, nb::arg("stream").none(), "iterations"_a,
           "Benchmark baseline: mean ns of a request + release looped in C++")
      .def("trim", [](Arena& a, nb::handle s) { a.trim(to_stream(a.backend(), s)); }, nb::arg("stream").none() = nb::none())
      .def("stats", [](const Arena& a) { return stats_dict(a.stats()); })
      .def_prop_ro("backend", &Arena::backend, nb::rv_policy::reference_internal)
      .def_prop_ro("options", [](const Arena& a) { return a.options(); })
      .def("capture",
           [](nb::handle self, nb::handle bindings, nb::handle stream, std::optional<CaptureFamily> family,
              const std::string& mode) {
             PyCapture c;
             c.arena_obj = nb::borrow(self);
             c.arena = &nb::cast<Arena&>(self);
             c.stream_obj = nb::borrow(stream);
             c.bindings = to_bindings(bindings);
             c.opts = capture_options(std::move(family), mode, nb::none());
             return c;
           },
           "bindings"_a, nb::arg("stream").none() = nb::none(), nb::arg("family").none() = nb::none(), "mode"_a = "global",
           "`with arena.capture(bindings) as cap:` records the block into a graph (cap.graph afterwards)");

  m.def("capture",
        [](nb::handle arena, nb::callable fn, nb::handle bindings, nb::handle stream, std::optional<CaptureFamily> family,
           const std::string& mode, nb::handle recapture) {
          Arena& a = nb::cast<Arena&>(arena);
          Stream s = to_stream(a.backend(), stream);
          auto f = share(fn);
          CapturedGraph g = capture(
              a, s, to_bindings(bindings),
              [f](const Bindings& b) {
                nb::gil_scoped_acquire gil;
                (*f)(nb::cast(b, nb::rv_policy::copy));
              },
              capture_options(std::move(family), mode, recapture));
          return PyGraph{nb::borrow(arena), std::move(g)};
        },
        "arena"_a, "fn"_a, "bindings"_a, nb::arg("stream").none() = nb::none(), nb::arg("family").none() = nb::none(), "mode"_a = "global",
        nb::arg("recapture").none() = nb::none(),
        "Capture fn(bindings) into a graph. recapture(refused_bindings) -> Bindings | None lets a replay whose "
        "guards fail re-capture with the bindings it returns (e.g. the next bucket) instead of raising.");

  nb::module_ debug_module = nb::borrow<nb::module_>(m.attr("debug"));
  debug_module.def(
      "check_canaries",
      [](PyGraph& g, nb::handle s) {
        Stream st = to_stream(nb::cast<Arena&>(g.arena).backend(), s);
        return finding_list(debug::check_canaries(g.graph, st));
      },
      "graph"_a, nb::arg("stream").none() = nb::none(),
      "Check the guard regions behind the graph's workspaces now; returns the overwrites found");
}

}  // namespace graphsafe::python
