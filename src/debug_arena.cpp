// Debug mode over the arena: capture findings, canaries (guard regions behind workspaces), NVTX
// Memory API registration, concurrent family replays; probe() and audit_replay().
#include "arena_core.hpp"
#include "internal_access.hpp"
#include "virtual_commit.hpp"

#include <graphsafe/cuda_backend.hpp>
#include <graphsafe/debug.hpp>
#include <graphsafe/error.hpp>

// Header-only NVTX (ships with the CUDA toolkit): without a tool attached every call is a no-op.
#include <nvtx3/nvToolsExtMem.h>

#include <cuda_runtime_api.h>

#include <cxxabi.h>
#include <dlfcn.h>
#include <execinfo.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <unordered_map>

namespace graphsafe {

// ---- Backend defaults ---------------------------------------------------------------------------

void Backend::fill_bytes(void*, std::uint64_t, std::uint8_t, Stream) {
  throw error("graphsafe: backend '" + std::string(name()) +
              "' does not implement fill_bytes, which debug canaries and audit_replay need");
}

void Backend::copy_to_host(void*, const void*, std::uint64_t, Stream) {
  throw error("graphsafe: backend '" + std::string(name()) +
              "' does not implement copy_to_host, which debug canaries and audit_replay need");
}

namespace debug {
std::string format_finding(const Finding& f);  // debug_report.cpp
}

namespace detail {

// Debug mode's view of an arena: the eager workspaces and their guards, the slabs registered with
// NVTX. Its state is guarded by the arena's lock (some events already run under it).
class DebugObserver final : public ArenaObserver {
 public:
  explicit DebugObserver(ArenaCore& c) : core(c), nvtx_on(c.opts.nvtx && c.backend.nvtx_heaps_supported()) {}

  void slab_added(std::uintptr_t addr, std::uint64_t bytes, bool heap) override;
  void slab_removed(std::uintptr_t addr) noexcept override;
  void request(std::uintptr_t addr, std::uint64_t bytes, std::string_view name, const std::source_location& loc,
               Stream s, bool opaque) override;
  void release(std::uintptr_t addr, void* stream) noexcept override;
  void capture_begin(SessionState& st) override;
  void captured_request(SessionState& st, const PlanEntry& e) override;
  void reuse_not_proven(SessionState& st, const PlanEntry& e, const std::string& why) override;
  void graph_created(SessionState& st, GraphState& g) override;
  void replay_begin(GraphState& g, Stream s, void* last_stream, const std::source_location& loc) override;
  void replay_end(GraphState& g, Stream s) override;
  void graph_destroyed(GraphState& g) noexcept override;

  ArenaCore& core;
  const bool nvtx_on;
  struct EagerGuard {
    std::uint64_t bytes;  // workspace bytes; the guard follows
    std::string name;
    std::string site;
    // Live graphs whose captured work uses this eager workspace: releasing it is a finding.
    std::vector<std::pair<const GraphState*, std::string>> captured_by;  // (graph, how)
  };
  std::unordered_map<std::uintptr_t, EagerGuard> eager_guards;           // under core.lock
  std::map<std::uintptr_t, std::pair<std::uint64_t, void*>> nvtx_heaps;  // slab -> (size, heap), under core.lock
};

DebugObserver* attach_debug_observer(ArenaCore& core) {
  auto o = std::make_unique<DebugObserver>(core);
  DebugObserver* p = o.get();
  core.attach(std::move(o));
  return p;
}

namespace {

constexpr std::uint8_t kCanary = 0xCD;  // host slabs are 0xA5: never mistaken for the pattern

bool ours(std::string_view k) {
  return k == debug::kind::unbounded_dynamic_size || k == debug::kind::opaque_request_in_capture ||
         k == debug::kind::probe_difference || k == debug::kind::concurrent_family_replay ||
         k == debug::kind::canary_overwrite || k == debug::kind::replay_mismatch || k == debug::kind::replay_refused ||
         k == debug::kind::captured_eager_release;
}

std::string hex_ptr(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

std::string hex_bytes(const void* p, std::size_t n) {
  const auto* b = static_cast<const unsigned char*>(p);
  std::string out = "0x";
  char buf[4];
  // Little-endian value: most significant byte first, at most 32 bytes shown.
  const std::size_t shown = std::min<std::size_t>(n, 32);
  for (std::size_t i = 0; i < shown; ++i) {
    std::snprintf(buf, sizeof buf, "%02x", b[shown - 1 - i]);
    out += buf;
  }
  if (n > shown) out += "...";
  return out;
}

// ---- NVTX Memory API --------------------------------------------------------------------------

nvtxDomainHandle_t nvtx_domain() {
  static nvtxDomainHandle_t d = nvtxDomainCreateA("graphsafe");
  return d;
}

void* nvtx_heap_register(std::uintptr_t addr, std::uint64_t size) {
  nvtxMemVirtualRangeDesc_t range{};
  range.size = size;
  range.ptr = reinterpret_cast<const void*>(addr);
  nvtxMemHeapDesc_t desc{};
  desc.extCompatID = NVTX_EXT_COMPATID_MEM;
  desc.structSize = sizeof(desc);
  desc.usage = NVTX_MEM_HEAP_USAGE_TYPE_SUB_ALLOCATOR;
  desc.type = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  desc.typeSpecificDescSize = sizeof(range);
  desc.typeSpecificDesc = &range;
  desc.messageType = NVTX_MESSAGE_TYPE_ASCII;
  desc.message.ascii = "graphsafe slab";
  return nvtxMemHeapRegister(nvtx_domain(), &desc);
}

void nvtx_heap_unregister(void* heap) { nvtxMemHeapUnregister(nvtx_domain(), static_cast<nvtxMemHeapHandle_t>(heap)); }

void nvtx_region_register(void* heap, std::uintptr_t addr, std::uint64_t bytes, const std::string& name) {
  if (!heap || bytes == 0) return;
  nvtxMemVirtualRangeDesc_t range{};
  range.size = bytes;
  range.ptr = reinterpret_cast<const void*>(addr);
  nvtxMemRegionsRegisterBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.regionType = NVTX_MEM_TYPE_VIRTUAL_ADDRESS;
  batch.heap = static_cast<nvtxMemHeapHandle_t>(heap);
  batch.regionCount = 1;
  batch.regionDescElementSize = sizeof(range);
  batch.regionDescElements = &range;
  batch.regionHandleElementsOut = nullptr;
  nvtxMemRegionsRegister(nvtx_domain(), &batch);

  nvtxMemRegionNameDesc_t nd{};
  nd.regionRefType = NVTX_MEM_REGION_REF_TYPE_POINTER;
  nd.nameType = NVTX_MESSAGE_TYPE_ASCII;
  nd.region.pointer = reinterpret_cast<const void*>(addr);
  // compute-sanitizer accepts at most 49 characters ("Memory region name cannot exceed 49
  // characters"): keep the end, which names the request.
  const std::string shown = name.size() <= 49 ? name : "..." + name.substr(name.size() - 46);
  nd.name.ascii = shown.c_str();
  nvtxMemRegionsNameBatch_t names{};
  names.extCompatID = NVTX_EXT_COMPATID_MEM;
  names.structSize = sizeof(names);
  names.regionCount = 1;
  names.regionElementSize = sizeof(nd);
  names.regionElements = &nd;
  nvtxMemRegionsName(nvtx_domain(), &names);
}

void nvtx_region_unregister(std::uintptr_t addr) {
  nvtxMemRegionRef_t ref{};
  ref.pointer = reinterpret_cast<const void*>(addr);
  nvtxMemRegionsUnregisterBatch_t batch{};
  batch.extCompatID = NVTX_EXT_COMPATID_MEM;
  batch.structSize = sizeof(batch);
  batch.refType = NVTX_MEM_REGION_REF_TYPE_POINTER;
  batch.refCount = 1;
  batch.refElementSize = sizeof(ref);
  batch.refElements = &ref;
  nvtxMemRegionsUnregister(nvtx_domain(), &batch);
}

// Heap (slab) holding `addr`; caller holds the arena's lock.
void* heap_for(ArenaCore& core, std::uintptr_t addr) {
  const auto& heaps = core.debug->nvtx_heaps;
  auto it = heaps.upper_bound(addr);
  if (it == heaps.begin()) return nullptr;
  --it;
  return addr < it->first + it->second.first ? it->second.second : nullptr;
}

bool has_memory(const PlanEntry& e) { return e.kind != PlanEntry::Kind::dimension; }
// Canaries and NVTX regions cover entries whose bytes no other workspace of the graph holds: a
// range reused within the capture holds another workspace's data (or guard) during a replay.
bool guarded(const PlanEntry& e) { return has_memory(e) && !e.shares_bytes; }

// The ranges a graph's workspaces register: each workspace no other one shares bytes with, and one
// range per group of workspaces whose ranges overlap (reused within the capture). The shared range
// stays addressable for memcheck; overflows inside it are not told apart.
struct NvtxRange {
  std::uintptr_t addr;
  std::uint64_t bytes;
  std::string name;
};
std::vector<NvtxRange> nvtx_ranges(const GraphState& g) {
  std::vector<NvtxRange> out, shared;
  for (const PlanEntry& e : g.plan.entries()) {
    if (!has_memory(e) || e.bytes == 0) continue;
    NvtxRange r{g.base + e.offset, e.bytes, e.name};
    (e.shares_bytes ? shared : out).push_back(std::move(r));
  }
  std::sort(shared.begin(), shared.end(), [](const NvtxRange& a, const NvtxRange& b) { return a.addr < b.addr; });
  std::vector<NvtxRange> merged;
  for (const NvtxRange& r : shared) {
    if (!merged.empty() && r.addr < merged.back().addr + merged.back().bytes) {
      NvtxRange& m = merged.back();
      m.bytes = std::max(m.addr + m.bytes, r.addr + r.bytes) - m.addr;
      m.name += "+" + r.name;
    } else {
      merged.push_back({r.addr, r.bytes, "shared " + r.name});
    }
  }
  out.insert(out.end(), merged.begin(), merged.end());
  return out;
}

// Register / unregister a graph's workspaces; caller holds the arena's lock.
void nvtx_register_graph(ArenaCore& core, GraphState& g) {
  for (const NvtxRange& r : nvtx_ranges(g))
    nvtx_region_register(heap_for(core, r.addr), r.addr, r.bytes, "graphsafe " + graph_label(g) + ": " + r.name);
  g.nvtx_registered = true;
  g.family->nvtx_owner = &g;
}

void nvtx_unregister_graph(ArenaCore& core, GraphState& g) {
  // Only what nvtx_register_graph registered: ranges inside a registered heap.
  for (const NvtxRange& r : nvtx_ranges(g))
    if (heap_for(core, r.addr)) nvtx_region_unregister(r.addr);
  g.nvtx_registered = false;
  if (g.family->nvtx_owner == &g) g.family->nvtx_owner = nullptr;
}

// ---- canaries ---------------------------------------------------------------------------------

// A finding when `guard` (n bytes read back from behind a workspace) lost its pattern.
bool canary_finding(const unsigned char* guard, std::uint64_t n, debug::Finding& f, const std::string& what,
                    std::uint64_t ws_bytes) {
  std::uint64_t first = n, changed = 0;
  for (std::uint64_t i = 0; i < n; ++i)
    if (guard[i] != kCanary) {
      if (first == n) first = i;
      ++changed;
    }
  if (!changed) return false;
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%02x", guard[first]);
  f.kind = std::string(debug::kind::canary_overwrite);
  f.message = what + " wrote past the end of workspace '" + f.request + "' (" + std::to_string(ws_bytes) +
              " bytes): " + std::to_string(changed) + " of the " + std::to_string(n) +
              " guard bytes behind it were overwritten, the first at +" + std::to_string(first) +
              " past its end (found " + buf + ", pattern 0xcd)";
  f.fix = "the kernels write more than the workspace holds at replay: size it from what they can write for any "
          "replay (capacity_bound / static_query_bound, or the dimension the kernel indexes with), or bound the "
          "kernel's writes; run compute-sanitizer memcheck in debug mode to get the faulting instruction";
  return true;
}

// Read back and check every guard of `g` (synchronizes `s`).
void check_graph(GraphState& g, Stream s) {
  ArenaCore& core = *g.core;
  g.last_overwrites.clear();
  if (!g.armed || core.guard_bytes == 0) return;
  const std::uint64_t n = core.guard_bytes;
  std::vector<const PlanEntry*> es;
  for (const PlanEntry& e : g.plan.entries())
    if (guarded(e)) es.push_back(&e);
  std::vector<unsigned char> buf(es.size() * n);
  for (std::size_t i = 0; i < es.size(); ++i)
    core.backend.copy_to_host(buf.data() + i * n, reinterpret_cast<const void*>(g.base + es[i]->offset + es[i]->bytes),
                              n, s);
  core.backend.synchronize(s);
  const std::string what = g.unchecked <= 1 ? "replay #" + std::to_string(g.replays) + " of " + graph_label(g)
                                            : "one of replays #" + std::to_string(g.replays - g.unchecked + 1) +
                                                  "..#" + std::to_string(g.replays) + " of " + graph_label(g);
  for (std::size_t i = 0; i < es.size(); ++i) {
    debug::Finding f;
    f.request = es[i]->name;
    f.graph = graph_label(g);
    f.site = es[i]->site;
    if (canary_finding(buf.data() + i * n, n, f, what, es[i]->bytes)) {
      std::fprintf(stderr, "graphsafe debug: canary overwritten\n%s", debug::format_finding(f).c_str());
      debug::report_finding(f);
      g.last_overwrites.push_back(std::move(f));
    }
  }
  g.unchecked = 0;
  if (!g.last_overwrites.empty()) g.armed = false;  // re-fill before the next replay
}

void arm_graph(GraphState& g, Stream s) {
  ArenaCore& core = *g.core;
  for (const PlanEntry& e : g.plan.entries())
    if (guarded(e)) core.backend.fill_bytes(reinterpret_cast<void*>(g.base + e.offset + e.bytes), core.guard_bytes,
                                               kCanary, s);
  g.armed = true;
  g.unchecked = 0;
}

// The first frame of the caller outside graphsafe and the standard library, named through dladdr
// (functions of an executable are named when it exports its symbols: -rdynamic). Unnamed frames
// cannot be told apart from graphsafe's own: the first few are listed as module+offset (addr2line).
std::string caller_site() {
  void* pcs[32];
  const int n = ::backtrace(pcs, 32);
  std::string unnamed;
  for (int i = 1, listed = 0; i < n; ++i) {
    Dl_info info{};
    if (!dladdr(pcs[i], &info)) continue;
    // The C / C++ runtime libraries (a container's destructor, the program's entry) are never it.
    const char* slash = info.dli_fname ? std::strrchr(info.dli_fname, '/') : nullptr;
    const std::string_view module = slash ? slash + 1 : info.dli_fname ? info.dli_fname : "";
    if (module.starts_with("libc.so") || module.starts_with("libstdc++") || module.starts_with("libgcc_s") ||
        module.starts_with("ld-linux"))
      continue;
    if (info.dli_sname) {
      int status = 0;
      char* d = abi::__cxa_demangle(info.dli_sname, nullptr, nullptr, &status);
      const std::string name = status == 0 && d ? d : info.dli_sname;
      std::free(d);
      // Demangled template functions start with their return type ("void std::_Destroy<...>").
      const std::string_view q = std::string_view(name).substr(0, name.find('('));
      const std::string_view last = q.substr(q.rfind(' ', q.find('<')) == std::string_view::npos
                                                 ? 0
                                                 : q.rfind(' ', q.find('<')) + 1);
      if (last.starts_with("graphsafe::") || last.starts_with("std::") || last.starts_with("__gnu_cxx::")) continue;
      return name.substr(0, 240);
    }
    if (listed++ < 4) {
      char off[32];
      std::snprintf(off, sizeof off, "+0x%zx",
                    static_cast<std::size_t>(reinterpret_cast<std::uintptr_t>(pcs[i]) -
                                             reinterpret_cast<std::uintptr_t>(info.dli_fbase)));
      unnamed += (unnamed.empty() ? "" : " < ") + std::string(module.empty() ? "?" : module) + off;
    }
  }
  return unnamed.empty() ? std::string("unknown") : "unnamed frames " + unnamed + " (link with -rdynamic to name them)";
}

// A captured-eager-release finding: eager workspace `name` released while graph `graph` uses it
// through `how` (during its capture when `during_capture`). `site` is the release site.
void report_captured_release(const std::string& name, std::uint64_t bytes, std::uintptr_t addr,
                             const std::string& request_site, const std::string& graph, const std::string& how,
                             std::string site, bool during_capture) {
  debug::Finding f;
  f.kind = std::string(debug::kind::captured_eager_release);
  f.request = name;
  f.graph = graph;
  f.site = std::move(site);
  f.message = "eager workspace '" + name + "' (" + std::to_string(bytes) + " bytes at " +
              hex_ptr(reinterpret_cast<const void*>(addr)) + ", requested at " + request_site + ") was released " +
              (during_capture ? "during the capture of " + graph + ", whose work uses it through "
                              : "while " + graph + " still uses it through ") +
              how +
              ": its bytes go back to the arena and are served again, and every replay of the graph reads and "
              "writes them under their new owner";
  f.fix = "request the workspace inside the capture (it then belongs to the graph and lives as long as it), or "
          "keep the eager workspace alive until the graph is destroyed";
  std::fprintf(stderr, "graphsafe debug: eager workspace released while a graph uses it\n%s",
               debug::format_finding(f).c_str());
  debug::report_finding(std::move(f));
}

// Eager workspaces released while a capture was under way, per arena (ArenaCore::id): the graph
// that capture makes is checked against them when it is created (they are no longer live eager
// blocks by then). Dropped once a graph is created with no capture left under way in its arena.
struct ReleasedInCapture {
  std::uintptr_t addr = 0;
  std::uint64_t bytes = 0;
  std::string name, request_site, release_site;
};
std::mutex released_mutex;
std::map<std::uint64_t, std::vector<ReleasedInCapture>>& released_in_capture() {
  static auto* m = new std::map<std::uint64_t, std::vector<ReleasedInCapture>>;  // never destroyed
  return *m;
}

std::atomic<std::uint64_t> next_graph_id{1};

}  // namespace

std::string graph_label(const GraphState& g) {
  return "family '" + g.family->name + "' graph #" + std::to_string(g.dbg_id);
}

// ---- arena events -------------------------------------------------------------------------------

void DebugObserver::capture_begin(SessionState& st) { st.report_mark = debug::finding_count(); }

void DebugObserver::slab_added(std::uintptr_t addr, std::uint64_t size, bool nvtx_heap) {
  // A virtual reservation is no NVTX heap: compute-sanitizer accepts a heap only over one allocation
  // it tracks, and a reservation is mapped granule by granule as replays grow (seen on the H200:
  // nvtxMemHeapRegister rejected over the 16 GiB range). Its workspaces go unregistered; canaries
  // and capture findings still cover them.
  if (nvtx_on && nvtx_heap) nvtx_heaps[addr] = {size, nvtx_heap_register(addr, size)};
}

void DebugObserver::slab_removed(std::uintptr_t addr) noexcept {
  std::lock_guard g(core.lock);
  if (auto it = nvtx_heaps.find(addr); it != nvtx_heaps.end()) {
    nvtx_heap_unregister(it->second.second);
    nvtx_heaps.erase(it);
  }
}

void DebugObserver::request(std::uintptr_t addr, std::uint64_t bytes, std::string_view name,
                            const std::source_location& loc, Stream s, bool) {
  const std::uint64_t guard_bytes = core.guard_bytes;
  if (guard_bytes && core.opts.canaries)
    core.backend.fill_bytes(reinterpret_cast<void*>(addr + bytes), guard_bytes, kCanary, s);
  std::lock_guard g(core.lock);
  eager_guards[addr] = EagerGuard{bytes, std::string(name), site_of(loc), {}};
  if (nvtx_on) nvtx_region_register(heap_for(core, addr), addr, bytes, "graphsafe eager: " + std::string(name));
}

void DebugObserver::release(std::uintptr_t addr, void* stream) noexcept {
  EagerGuard eg;
  std::vector<std::pair<std::string, std::string>> captured_by_labels;  // (graph, how)
  {
    std::lock_guard g(core.lock);
    auto it = eager_guards.find(addr);
    if (it == eager_guards.end()) return;
    eg = std::move(it->second);
    eager_guards.erase(it);
    if (nvtx_on && heap_for(core, addr)) nvtx_region_unregister(addr);
    try {
      for (const auto& [graph, how] : eg.captured_by) captured_by_labels.emplace_back(graph_label(*graph), how);
    } catch (...) {
    }
  }
  if (!captured_by_labels.empty() || core.active_sessions.load(std::memory_order_acquire) > 0) {
    // The bytes go back to the free list now (as without debug mode): the finding says what every
    // later replay of the graph will do with them.
    try {
      std::string site = caller_site();
      for (const auto& [label, how] : captured_by_labels)
        report_captured_release(eg.name, eg.bytes, addr, eg.site, label, how, site, false);
      if (core.active_sessions.load(std::memory_order_acquire) > 0) {
        std::lock_guard lk(released_mutex);
        released_in_capture()[core.id].push_back({addr, eg.bytes, eg.name, eg.site, std::move(site)});
      }
    } catch (...) {
      // noexcept path (a Workspace dying): a finding that cannot be recorded is dropped.
    }
  }
  const std::uint64_t guard_bytes = core.guard_bytes;
  if (!guard_bytes || !core.opts.canaries) return;
  try {
    const Stream s = tagged_stream(stream);
    if (core.backend.capture_info(s).active) return;  // released inside a capture: cannot synchronize here
    std::vector<unsigned char> buf(guard_bytes);
    core.backend.copy_to_host(buf.data(), reinterpret_cast<const void*>(addr + eg.bytes), guard_bytes, s);
    core.backend.synchronize(s);
    debug::Finding f;
    f.request = eg.name;
    f.graph = "eager";
    f.site = eg.site;
    if (canary_finding(buf.data(), guard_bytes, f, "eager work on this stream", eg.bytes)) {
      std::fprintf(stderr, "graphsafe debug: canary overwritten\n%s", debug::format_finding(f).c_str());
      debug::report_finding(std::move(f));
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "graphsafe debug: could not check the canary of eager workspace '%s': %s\n", eg.name.c_str(),
                 e.what());
  } catch (...) {
  }
}

void DebugObserver::captured_request(SessionState& st, const PlanEntry& e) {
  const std::string graph = "family '" + st.family->name + "' (capture)";
  if (e.kind == PlanEntry::Kind::opaque) {
    debug::report_finding(debug::kind::opaque_request_in_capture, e.site,
                          "opaque request of " + std::to_string(e.bytes) +
                              " bytes during capture: graphsafe cannot tell what this size depends on; if it was "
                              "computed from a dynamic value (a length, a count), every replay keeps the capture-time "
                              "size and no guard can check it",
                          "request it through Arena::request with an Extent and a sizing policy (capacity_bound), "
                          "or size it for the largest case the graph will be replayed with",
                          e.name, graph);
  } else if (!e.replay_safe && e.need && !st.plan.findings().empty()) {
    debug::report_finding(debug::kind::unbounded_dynamic_size, e.site, st.plan.findings().back().message,
                          "size it with capacity_bound (declare the symbol's capacity) or static_query_bound (a bound "
                          "in static symbols); or let the graph re-capture at a larger bucket (CaptureOptions::recapture)",
                          e.name, graph);
  }
}

// ---- eager memory captured by pointer ------------------------------------------------------------

// Addresses the captured CUDA graph uses (below, with the probe's kernel-node helpers).
void graph_pointers(void* graph, std::vector<CapturedPointer>& out);

namespace {

// Links the eager workspaces `g`'s captured work uses to `g`; they are reported if released before
// it dies. Caller does not hold the lock.
void link_captured_eager(ArenaCore& core, GraphState& g) {
  std::vector<CapturedPointer> ptrs = std::move(g.dbg_pointers);
  g.dbg_pointers.clear();
  if (core.backend.name() == "cuda" && g.handle.graph) {
    try {
      graph_pointers(g.handle.graph, ptrs);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "graphsafe debug: could not read the pointers of %s's nodes: %s\n", graph_label(g).c_str(),
                   e.what());
    }
  }
  std::string notes;
  std::vector<bool> live(ptrs.size(), false);  // falls in a live eager workspace
  if (!ptrs.empty()) {
    std::lock_guard lk(core.lock);
    std::vector<std::pair<std::uintptr_t, DebugObserver::EagerGuard*>> blocks;
    blocks.reserve(core.debug->eager_guards.size());
    for (auto& [addr, eg] : core.debug->eager_guards) blocks.emplace_back(addr, &eg);
    std::sort(blocks.begin(), blocks.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (std::size_t i = 0; i < ptrs.size(); ++i) {
      const CapturedPointer& p = ptrs[i];
      auto it = std::upper_bound(blocks.begin(), blocks.end(), p.addr,
                                 [](std::uintptr_t a, const auto& b) { return a < b.first; });
      if (it == blocks.begin()) continue;
      --it;
      DebugObserver::EagerGuard& eg = *it->second;
      if (p.addr >= it->first + std::max<std::uint64_t>(eg.bytes, 1)) continue;
      live[i] = true;
      const bool known = std::any_of(eg.captured_by.begin(), eg.captured_by.end(),
                                     [&](const auto& c) { return c.first == &g; });
      if (known) continue;
      eg.captured_by.emplace_back(&g, p.how);
      notes += "graphsafe debug: " + graph_label(g) + " uses eager workspace '" + eg.name + "' (requested at " +
               eg.site + ") through " + p.how + ": keep it alive until the graph is destroyed\n";
    }
  }
  std::vector<ReleasedInCapture> released;
  {
    std::lock_guard lk(released_mutex);
    auto it = released_in_capture().find(core.id);
    if (it != released_in_capture().end()) {
      released = it->second;
      if (core.active_sessions.load(std::memory_order_acquire) == 0) released_in_capture().erase(it);
    }
  }
  for (const ReleasedInCapture& r : released)
    for (std::size_t i = 0; i < ptrs.size(); ++i)
      if (!live[i] && ptrs[i].addr >= r.addr && ptrs[i].addr < r.addr + std::max<std::uint64_t>(r.bytes, 1)) {
        report_captured_release(r.name, r.bytes, r.addr, r.request_site, graph_label(g), ptrs[i].how, r.release_site,
                                true);
        break;  // one finding per workspace and graph
      }
  std::fputs(notes.c_str(), stderr);
}

}  // namespace

void DebugObserver::reuse_not_proven(SessionState& st, const PlanEntry& e, const std::string& why) {
  debug::report_finding(debug::kind::reuse_not_proven, e.site,
                        "request '" + e.name + "' (" + std::to_string(e.bytes) + " B) grew the region: " + why,
                        "record an event on the releasing stream after the release and make this request's stream "
                        "wait on it (a join), or request on the releasing stream",
                        e.name, "family '" + st.family->name + "' (capture)");
}

// ---- graph hooks ---------------------------------------------------------------------------------

void DebugObserver::graph_created(SessionState& st, GraphState& g) {
  const std::size_t report_mark = st.report_mark;
  g.dbg_id = next_graph_id.fetch_add(1);
  link_captured_eager(core, g);
  // The capture's report: its own findings, plus external ones (CUPTI) made while it ran.
  std::string body;
  std::size_t n = 0;
  const std::string graph_at_capture = "family '" + g.family->name + "' (capture)";
  const auto all = debug::findings();
  for (std::size_t i = 0; i < all.size(); ++i) {
    const debug::Finding& f = all[i];
    const bool mine = f.graph == graph_at_capture &&
                      std::any_of(g.plan.entries().begin(), g.plan.entries().end(),
                                  [&](const PlanEntry& e) { return e.name == f.request && e.site == f.site; });
    const bool external = i >= report_mark && !ours(f.kind);
    if (mine || external) {
      body += debug::format_finding(f);
      ++n;
    }
  }
  std::fprintf(stderr,
               "graphsafe debug: capture of %s: %zu request(s), %llu bytes (peak live %llu), %zu live guard(s), "
               "%zu finding(s)\n%s",
               graph_label(g).c_str(), g.plan.entries().size(), static_cast<unsigned long long>(g.plan.bytes()),
               static_cast<unsigned long long>(g.plan.peak_live_bytes()),
               g.plan.guard_count(), n, body.c_str());
  if (nvtx_on) {
    std::lock_guard lk(core.lock);
    if (!g.family->nvtx_owner) nvtx_register_graph(core, g);
  }
}

void DebugObserver::replay_begin(GraphState& g, Stream s, void* last_stream, const std::source_location& loc) {
  Family& f = *g.family;
  if (last_stream && last_stream != stream_tag(s)) {
    debug::report_finding(
        debug::kind::concurrent_family_replay, site_of(loc),
        graph_label(g) + " replayed on stream " + hex_ptr(s.handle()) + " while the family's previous replay was "
            "issued on stream " + hex_ptr(last_stream) + "; the graphs of one family share one region, so graphsafe "
            "orders this replay after the previous one (an event): they cannot run concurrently",
        "replay a family's graphs on one stream, or give graphs that must run concurrently separate families "
        "(CaptureOptions::family)",
        "", graph_label(g));
  }
  if (core.guard_bytes && core.opts.canaries) {
    GraphState* prev = f.dbg_last_graph;
    if (prev && prev != &g) {
      // The other graph's replays may have written over this graph's guards (and this replay over
      // its guards): check what it left, then both re-arm before their next replay.
      if (prev->virt && virtual_guards_unmapped(*prev->virt)) prev->armed = false;  // shrunk: nothing to read
      if (prev->unchecked && prev->armed) check_graph(*prev, tagged_stream(prev->dbg_stream));
      prev->armed = false;
      g.armed = false;
    }
    if (!g.armed) arm_graph(g, s);
  }
  if (nvtx_on && !g.nvtx_registered) {
    std::lock_guard lk(core.lock);
    if (f.nvtx_owner) nvtx_unregister_graph(core, *f.nvtx_owner);
    nvtx_register_graph(core, g);
  }
  f.dbg_last_graph = &g;
}

void DebugObserver::replay_end(GraphState& g, Stream s) {
  ++g.replays;
  g.dbg_stream = stream_tag(s);
  if (core.guard_bytes && core.opts.canaries && g.armed) {
    ++g.unchecked;
    if (core.opts.canary_check_every && g.unchecked >= core.opts.canary_check_every) check_graph(g, s);
  }
}

void DebugObserver::graph_destroyed(GraphState& g) noexcept {
  std::lock_guard lk(core.lock);
  if (g.nvtx_registered) nvtx_unregister_graph(core, g);
  if (g.family->dbg_last_graph == &g) g.family->dbg_last_graph = nullptr;
  for (auto& [addr, eg] : eager_guards)
    std::erase_if(eg.captured_by, [&](const auto& c) { return c.first == &g; });
}

// ---- probe: CUDA kernel nodes -------------------------------------------------------------------

namespace {

// A kernel's parameter count through the driver's cuFuncGetParamCount where the driver has it (looked
// up at run time: CUDA 13.0's headers do not declare it). Without it the caller walks
// cudaFuncGetParamInfo until it fails, which compute-sanitizer memcheck reports as an API error
// (an expected one: bench/run_gpu_suite.sh lists it). SIZE_MAX = unknown.
std::size_t param_count(const void* func) {
  using Fn = int (*)(void* /*CUfunction*/, std::size_t*);
  static const Fn fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    // Asked at the runtime's own version: a version above it is an invalid argument (an API error
    // under memcheck, seen on the H200); a driver without the symbol answers "not found".
    int rt = 0;
    if (cudaRuntimeGetVersion(&rt) != cudaSuccess ||
        cudaGetDriverEntryPointByVersion("cuFuncGetParamCount", &p, static_cast<unsigned>(rt), cudaEnableDefault,
                                         &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      p = nullptr;
    cudaGetLastError();
    return reinterpret_cast<Fn>(p);
  }();
  cudaFunction_t f = nullptr;
  std::size_t n = 0;
  if (!fn || cudaGetFuncBySymbol(&f, func) != cudaSuccess || fn(f, &n) != 0) {
    cudaGetLastError();
    return SIZE_MAX;
  }
  return n;
}

std::vector<cudaGraphNode_t> kernel_nodes(cudaGraph_t g) {
  std::size_t n = 0;
  GRAPHSAFE_CUDA(cudaGraphGetNodes(g, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) GRAPHSAFE_CUDA(cudaGraphGetNodes(g, nodes.data(), &n));
  nodes.resize(n);
  std::vector<cudaGraphNode_t> out;
  for (cudaGraphNode_t node : nodes) {
    cudaGraphNodeType t{};
    GRAPHSAFE_CUDA(cudaGraphNodeGetType(node, &t));
    if (t == cudaGraphNodeTypeKernel) out.push_back(node);
  }
  return out;
}

std::string kernel_name(const void* func) {
  const char* name = nullptr;
  if (cudaFuncGetName(&name, func) != cudaSuccess || !name) {
    cudaGetLastError();  // not sticky: the function is just not known to the runtime by name
    return "kernel@" + hex_ptr(func);
  }
  return name;
}

std::string dim3_str(dim3 d) {
  return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")";
}

void probe_kernels(void* graph_a, void* graph_b, const std::string& label, std::vector<debug::Finding>& out) {
  const auto ka = kernel_nodes(static_cast<cudaGraph_t>(graph_a));
  const auto kb = kernel_nodes(static_cast<cudaGraph_t>(graph_b));
  auto add = [&](std::string request, std::string message) {
    debug::Finding f;
    f.kind = std::string(debug::kind::probe_difference);
    f.request = std::move(request);
    f.graph = label;
    f.message = std::move(message);
    f.fix = "this launch is frozen at capture from a dynamic value: read the value on the device (a length buffer "
            "updated before each replay), or derive it from a graphsafe dimension sized with a replay-safe policy";
    out.push_back(std::move(f));
  };
  if (ka.size() != kb.size())
    add("", "the captures contain " + std::to_string(ka.size()) + " and " + std::to_string(kb.size()) +
                " kernel nodes: the work captured depends on the dynamic bindings");
  for (std::size_t i = 0; i < std::min(ka.size(), kb.size()); ++i) {
    cudaKernelNodeParams pa{}, pb{};
    GRAPHSAFE_CUDA(cudaGraphKernelNodeGetParams(ka[i], &pa));
    GRAPHSAFE_CUDA(cudaGraphKernelNodeGetParams(kb[i], &pb));
    const std::string name = kernel_name(pa.func);
    const std::string node = "kernel node #" + std::to_string(i) + " (" + name + ")";
    if (pa.func != pb.func) {
      add(name, node + ": a different kernel (" + kernel_name(pb.func) + ") is launched with the second bindings");
      continue;
    }
    if (pa.gridDim.x != pb.gridDim.x || pa.gridDim.y != pb.gridDim.y || pa.gridDim.z != pb.gridDim.z ||
        pa.blockDim.x != pb.blockDim.x || pa.blockDim.y != pb.blockDim.y || pa.blockDim.z != pb.blockDim.z ||
        pa.sharedMemBytes != pb.sharedMemBytes)
      add(name, node + ": launch shape differs: grid " + dim3_str(pa.gridDim) + " block " + dim3_str(pa.blockDim) +
                    " smem " + std::to_string(pa.sharedMemBytes) + " vs grid " + dim3_str(pb.gridDim) + " block " +
                    dim3_str(pb.blockDim) + " smem " + std::to_string(pb.sharedMemBytes));
    if (!pa.kernelParams || !pb.kernelParams) continue;  // launched with `extra`: arguments not readable
    const std::size_t n_params = param_count(pa.func);
    for (std::size_t p = 0; p < n_params; ++p) {
      std::size_t offset = 0, size = 0;
      if (cudaFuncGetParamInfo(pa.func, p, &offset, &size) != cudaSuccess) {
        cudaGetLastError();  // past the last parameter (or not queryable): not sticky
        break;
      }
      if (std::memcmp(pa.kernelParams[p], pb.kernelParams[p], size) != 0)
        add(name, node + ": argument " + std::to_string(p) + " (" + std::to_string(size) + " bytes at offset " +
                      std::to_string(offset) + ") differs: " + hex_bytes(pa.kernelParams[p], size) + " vs " +
                      hex_bytes(pb.kernelParams[p], size));
    }
  }
}

// Every address a node of `graph` (and of its child graphs) uses: each pointer-sized word of each
// kernel argument (struct arguments carry pointers too), the source and destination of copies, the
// destination of memsets.
void graph_pointers_into(cudaGraph_t graph, const std::string& prefix, std::vector<CapturedPointer>& out) {
  std::size_t n = 0;
  GRAPHSAFE_CUDA(cudaGraphGetNodes(graph, nullptr, &n));
  std::vector<cudaGraphNode_t> nodes(n);
  if (n) GRAPHSAFE_CUDA(cudaGraphGetNodes(graph, nodes.data(), &n));
  nodes.resize(n);
  auto add = [&](const void* p, std::string how) {
    if (p) out.push_back({reinterpret_cast<std::uintptr_t>(p), prefix + std::move(how)});
  };
  for (std::size_t i = 0; i < nodes.size(); ++i) {
    cudaGraphNodeType t{};
    GRAPHSAFE_CUDA(cudaGraphNodeGetType(nodes[i], &t));
    const std::string node = "node #" + std::to_string(i);
    if (t == cudaGraphNodeTypeKernel) {
      cudaKernelNodeParams kp{};
      GRAPHSAFE_CUDA(cudaGraphKernelNodeGetParams(nodes[i], &kp));
      if (!kp.kernelParams) continue;  // launched with `extra`: declare its pointers (captured_pointer)
      const std::string name = kernel_name(kp.func);
      const std::size_t n_params = param_count(kp.func);
      for (std::size_t a = 0; a < n_params; ++a) {
        std::size_t offset = 0, size = 0;
        if (cudaFuncGetParamInfo(kp.func, a, &offset, &size) != cudaSuccess) {
          cudaGetLastError();  // past the last parameter: not sticky
          break;
        }
        for (std::size_t w = 0; w + sizeof(void*) <= size; w += sizeof(void*)) {
          const void* v = nullptr;
          std::memcpy(&v, static_cast<const char*>(kp.kernelParams[a]) + w, sizeof v);
          add(v, "argument " + std::to_string(a) + (w ? " (+" + std::to_string(w) + " bytes)" : std::string()) +
                     " of " + node + " (kernel " + name + ")");
        }
      }
    } else if (t == cudaGraphNodeTypeMemcpy) {
      cudaMemcpy3DParms mp{};
      GRAPHSAFE_CUDA(cudaGraphMemcpyNodeGetParams(nodes[i], &mp));
      add(mp.srcPtr.ptr, "the source of " + node + " (memcpy)");
      add(mp.dstPtr.ptr, "the destination of " + node + " (memcpy)");
    } else if (t == cudaGraphNodeTypeMemset) {
      cudaMemsetParams ms{};
      GRAPHSAFE_CUDA(cudaGraphMemsetNodeGetParams(nodes[i], &ms));
      add(ms.dst, "the destination of " + node + " (memset)");
    } else if (t == cudaGraphNodeTypeGraph) {
      cudaGraph_t child = nullptr;
      GRAPHSAFE_CUDA(cudaGraphChildGraphNodeGetGraph(nodes[i], &child));
      graph_pointers_into(child, prefix + node + " (child graph): ", out);
    }
  }
}

std::string dynamic_values(const PlanEntry& e, const Bindings& b) {
  std::string out;
  if (!e.need) return out;
  for (Symbol s : e.need->dynamic_symbols()) out += (out.empty() ? "" : ", ") + b.describe(s);
  return out;
}

const char* kind_word(PlanEntry::Kind k) {
  return k == PlanEntry::Kind::dimension ? "dimension" : k == PlanEntry::Kind::opaque ? "opaque request" : "workspace";
}

}  // namespace

void graph_pointers(void* graph, std::vector<CapturedPointer>& out) {
  graph_pointers_into(static_cast<cudaGraph_t>(graph), "", out);
}

}  // namespace detail

// ---- public debug API -----------------------------------------------------------------------------

namespace debug {

void captured_pointer(Arena& arena, Stream s, const void* p, std::string_view what, std::source_location loc) {
  detail::ArenaCore& core = detail::core_of(arena);
  if (!core.debug) return;
  detail::SessionState* st = core.session_for(s);
  if (!st)
    throw capture_state_error("graphsafe: debug::captured_pointer(" + detail::hex_ptr(p) + (what.empty() ? "" : ", '") +
                              std::string(what) + (what.empty() ? "" : "'") + ") at " + detail::site_of(loc) +
                              " on a stream that is not capturing; declare the pointers of captured work inside the "
                              "capture function");
  std::lock_guard lk(core.lock);
  st->dbg_pointers.push_back({reinterpret_cast<std::uintptr_t>(p),
                              "pointer " + (what.empty() ? std::string() : "'" + std::string(what) + "' ") +
                                  "declared at " + detail::site_of(loc)});
}

std::vector<Finding> check_canaries(CapturedGraph& graph, Stream s) {
  detail::GraphState* g = detail::impl_of(graph);
  if (!g || (!g->handle.exec && !g->handle.graph))
    throw capture_state_error("graphsafe: check_canaries on a graph that was moved from or destroyed");
  detail::ArenaCore& core = *g->core;
  if (!core.debug || !core.guard_bytes || !core.opts.canaries) return {};
  // Another graph of the family replayed since: the guards are its to write (it re-arms them).
  if (g->family->dbg_last_graph != g) return {};
  // Virtual growth: a shrink unmapped the guards since the last replay -- nothing left to read.
  if (g->virt && detail::virtual_guards_unmapped(*g->virt)) g->armed = false;
  if (g->armed && g->unchecked) detail::check_graph(*g, s);
  return g->last_overwrites;
}

std::vector<Finding> probe(Arena& arena, Stream s, const std::function<void(const Bindings&)>& fn, const Bindings& a,
                           const Bindings& b) {
  // One fresh family: both graphs start at the family's region base, so equal offsets mean equal
  // pointers in the kernel arguments and only real differences show.
  CaptureOptions o;
  o.family = arena.family("probe");
  CapturedGraph ga = capture(arena, s, a, fn, o);
  CapturedGraph gb = capture(arena, s, b, fn, o);
  const std::string label = "probe of family 'probe'";
  std::vector<Finding> out;
  const auto& ea = ga.plan().entries();
  const auto& eb = gb.plan().entries();
  auto add = [&](const PlanEntry& e, std::string message, std::string fix) {
    Finding f;
    f.kind = std::string(kind::probe_difference);
    f.request = e.name;
    f.graph = label;
    f.site = e.site;
    f.message = std::move(message);
    f.fix = std::move(fix);
    out.push_back(std::move(f));
  };
  const std::string size_fix =
      "this size is frozen at capture from a dynamic value: size it with capacity_bound or static_query_bound "
      "(through Arena::request / Arena::dimension with an Extent, if it is a plain size_t today)";
  if (ea.size() != eb.size()) {
    Finding f;
    f.kind = std::string(kind::probe_difference);
    f.graph = label;
    f.message = "the captures made " + std::to_string(ea.size()) + " and " + std::to_string(eb.size()) +
                " requests: which requests are made depends on the dynamic bindings";
    f.fix = "make the same requests for every binding (size them for the largest case)";
    out.push_back(std::move(f));
  }
  for (std::size_t i = 0; i < std::min(ea.size(), eb.size()); ++i) {
    const PlanEntry& x = ea[i];
    const PlanEntry& y = eb[i];
    const std::string what = std::string(detail::kind_word(x.kind)) + " #" + std::to_string(i) + " '" + x.name + "'";
    if (x.kind != y.kind || (x.kind != PlanEntry::Kind::opaque && x.name != y.name)) {
      add(x, what + " is '" + y.name + "' in the second capture: the request sequence depends on the bindings",
          "make the same requests in the same order for every binding");
      continue;
    }
    const std::string va = detail::dynamic_values(x, a), vb = detail::dynamic_values(y, b);
    const std::string with = va.empty() ? "" : " (" + va + " vs " + vb + ")";
    if (x.reserved != y.reserved || x.bytes != y.bytes)
      add(x,
          what + " sized " + std::to_string(x.reserved) + (x.kind == PlanEntry::Kind::opaque ? " bytes" : " elements") +
              (x.bytes ? " (" + std::to_string(x.bytes) + " B)" : "") + " vs " + std::to_string(y.reserved) +
              (y.bytes ? " (" + std::to_string(y.bytes) + " B)" : "") + with + ", policy " + x.policy,
          size_fix);
    if (x.kind != PlanEntry::Kind::dimension && x.offset != y.offset)
      add(x, what + " placed at offset " + std::to_string(x.offset) + " vs " + std::to_string(y.offset) +
                 ": an earlier request's size depends on the bindings",
          size_fix);
  }
  if (arena.backend().name() == "cuda" && ga.handle().graph && gb.handle().graph)
    detail::probe_kernels(ga.handle().graph, gb.handle().graph, label, out);
  for (const Finding& f : out) report_finding(f);
  return out;
}

std::vector<AuditStep> audit_replay(Arena& arena, Stream s, const std::function<void(const Bindings&)>& fn,
                                    const std::function<std::span<const std::byte>()>& output,
                                    const Bindings& capture_bindings, const std::vector<Bindings>& later,
                                    AuditOptions opts) {
  Backend& be = arena.backend();
  if (opts.prepare) opts.prepare(capture_bindings);
  CapturedGraph graph = capture(arena, s, capture_bindings, fn);
  const std::string label = "audit_replay graph (" + graph.family().name() + ")";
  std::vector<AuditStep> steps;
  for (std::size_t i = 0; i < later.size(); ++i) {
    const Bindings& b = later[i];
    AuditStep st;
    st.step = i;
    std::string vals;
    for (Symbol sym : graph.plan().symbols())
      if (sym.is_dynamic() && b.has(sym)) vals += (vals.empty() ? "" : ", ") + b.describe(sym);
    const std::span<const std::byte> out = output();
    void* dev = const_cast<std::byte*>(out.data());
    const std::uint64_t n = out.size();
    std::vector<unsigned char> eager(n), replayed(n);
    // Eager run: every request sized for these bindings.
    if (opts.prepare) opts.prepare(b);
    be.fill_bytes(dev, n, opts.poison, s);
    fn(b);
    be.copy_to_host(eager.data(), out.data(), n, s);
    be.synchronize(s);
    // The graph on the same inputs.
    if (opts.prepare) opts.prepare(b);
    be.fill_bytes(dev, n, opts.poison, s);
    try {
      if (opts.bypass_guards)
        graph.replay_unguarded_for_testing(s);
      else
        graph.replay(b, s);
    } catch (const guard_failure& e) {
      st.refused = true;
      st.message = "step " + std::to_string(i) + " (" + vals + "): replay refused by its guard: " + e.what();
      report_finding(kind::replay_refused, "", st.message,
                     "the graph cannot serve these bindings: size the requests with replay-safe policies or re-capture "
                     "at a larger bucket",
                     "", label);
      steps.push_back(std::move(st));
      continue;
    }
    be.copy_to_host(replayed.data(), out.data(), n, s);
    be.synchronize(s);
    for (std::uint64_t k = 0; k < n; ++k)
      if (eager[k] != replayed[k]) {
        if (!st.differing_bytes) st.first_difference = k;
        ++st.differing_bytes;
      }
    st.equal = st.differing_bytes == 0;
    if (st.equal) {
      st.message = "step " + std::to_string(i) + " (" + vals + "): equal (" + std::to_string(n) + " bytes)";
    } else {
      char buf[64];
      std::snprintf(buf, sizeof buf, "eager 0x%02x, graph 0x%02x", eager[st.first_difference],
                    replayed[st.first_difference]);
      st.message = "step " + std::to_string(i) + " (" + vals + "): the graph's output differs from the eager run in " +
                   std::to_string(st.differing_bytes) + " of " + std::to_string(n) + " bytes, first at byte " +
                   std::to_string(st.first_difference) + " (" + buf + ")";
      report_finding(kind::replay_mismatch, "", st.message,
                     "a size, offset or launch shape frozen at capture depends on these bindings: run debug::probe on "
                     "the capture function to see which, and size it with capacity_bound / static_query_bound",
                     "", label);
    }
    steps.push_back(std::move(st));
  }
  return steps;
}

}  // namespace debug
}  // namespace graphsafe
