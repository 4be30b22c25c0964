// Arena: the graph-safe workspace allocator.
//
//   graphsafe::CudaBackend backend;
//   graphsafe::Arena arena(backend);
//   arena.reserve(1 << 30, stream);                       // before capture
//   auto ws = arena.request(stream, "kv", rows * 512, sizeof(bf16), capacity_bound, bindings);
//
// Reserves slabs from the backend before capture (a dedicated cudaMemPool_t for CUDA) and serves
// requests from them by best-fit with coalescing, 256-byte aligned, stream-ordered frees. Eager
// releases coalesce lazily: a released block is first offered to the next request of its exact
// size on its stream (one arena lock per request/release pair); anything that needs the whole free
// state -- a request no free block fits, reserve, trim, a capture, stats() -- coalesces first. Requests
// on a stream that is capturing through graphsafe (CaptureSession / capture()) are sized by their
// policy, recorded in the capture's plan and placed in the capture family's region, which stays
// reserved for as long as a graph of the family lives. A workspace released during the capture
// gives its range to the capture's later requests that the graph orders after every use of it
// (same stream, or a stream whose capture joined the releasing one after the release), so a region
// follows peak live bytes rather than the sum of requests. Growth adds a slab and never moves one, so
// an address a graph saw is never reallocated: address stability holds by construction.
#pragma once

#include <graphsafe/backend.hpp>
#include <graphsafe/bindings.hpp>
#include <graphsafe/extent.hpp>
#include <graphsafe/footprint.hpp>
#include <graphsafe/sizing_policy.hpp>
#include <graphsafe/workspace.hpp>

#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>

namespace graphsafe {

class VirtualMemory;  // graphsafe/virtual_memory.hpp

namespace detail {
class ArenaCore;
struct Family;
struct InternalAccess;  // the library's own sources reach the private state through it
}  // namespace detail

inline constexpr std::uint64_t kAlignment = 256;

// Virtual growth: whether workspaces of one capture share physical memory (docs/virtual_growth.md,
// "Sharing physical memory").
enum class VirtualSharing : std::uint8_t {
  off,  // every workspace has its own physical granules (the default)
  // Workspaces whose lifetimes in the capture are disjoint -- proven by the ordering rules of the
  // ordinary arena's in-capture reuse -- map the same physical chunks, each at its own addresses:
  // physical commit follows the peak live bytes, addresses stay distinct.
  disjoint_lifetimes,
};

struct ArenaOptions {
  // Minimum slab size when an eager request finds no room and the arena grows (1 .. 2^62; options
  // out of range are refused when the arena is made, with invalid_argument_error).
  std::uint64_t growth_bytes = 64ull << 20;
  // Eager requests (outside capture) may add slabs. Requests during capture never do.
  bool grow_on_demand = true;
  // Under capture, a policy result that is not replay-safe (exact_at_capture on a dynamic extent)
  // throws policy_refusal instead of being recorded as a finding and guarded.
  bool refuse_unsafe_capture = false;
  // Print capture findings on stderr when a capture ends.
  bool report_findings = true;
  // Query the stream's capture state on every request, even when no graphsafe capture is under
  // way, and refuse requests on streams captured outside graphsafe. Costs ~60 ns per request on an
  // H200; the debug mode turns it on.
  bool always_check_capture = false;
  // Debug mode (include/graphsafe/debug.hpp, docs/debug_mode.md). Also on for every arena when the
  // GRAPHSAFE_DEBUG environment variable is set (read when the arena is made; docs/concepts.md,
  // "Configuration"). Turns on always_check_capture, the debug report, canaries and NVTX
  // registration. Off, it costs one predictable branch per request and per replay.
  bool debug = false;
  // Debug mode: guard region behind every workspace (bytes; 0 = none; at most 1 GiB).
  std::uint64_t canary_bytes = 256;
  // Debug mode: fill the guard regions with a pattern and check them. Off keeps the (unregistered)
  // gaps for compute-sanitizer without touching them.
  bool canaries = true;
  // Debug mode: check a graph's canaries after every this many replays (0: only when
  // debug::check_canaries is called). 1 names the exact replay that wrote past a workspace.
  std::uint32_t canary_check_every = 1;
  // Debug mode, CUDA backend: register slabs (as heaps) and workspaces (as named regions) with the
  // NVTX Memory API so compute-sanitizer memcheck sees workspace bounds inside a slab. Needs slabs
  // the sanitizer sees as allocations (CudaBackendOptions::plain_allocations, or GRAPHSAFE_DEBUG=1);
  // over the stream-ordered pool nothing is registered (the sanitizer rejects such heaps).
  bool nvtx = true;
  // Virtual growth (docs/virtual_growth.md). When set, each capture family gets an address range of
  // virtual_reserve_bytes (halved down to 1 GiB if that cannot be reserved); captured requests are
  // placed in it at their policy's bound, and physical memory (granules from this pool) is mapped
  // only behind their footprints: at capture for the capture-time bindings, before each replay
  // (after the guards) when the need grew. Nothing the graph saw ever moves. Eager requests are
  // unchanged. Empty (the default): the ordinary arena, at no cost.
  std::shared_ptr<VirtualMemory> virtual_memory;
  std::uint64_t virtual_reserve_bytes = 1ull << 40;
  // Virtual growth: share physical chunks between workspaces with disjoint lifetimes (needs
  // virtual_memory; refused without it). Off by default: see docs/virtual_growth.md for the cost.
  VirtualSharing virtual_sharing = VirtualSharing::off;
};

struct ArenaStats {
  std::uint64_t slab_bytes = 0;       // held from the backend
  std::uint64_t slabs = 0;
  std::uint64_t free_bytes = 0;       // in free blocks
  std::uint64_t largest_free = 0;
  std::uint64_t eager_bytes = 0;      // in eager (non-captured) workspaces
  std::uint64_t eager_blocks = 0;
  std::uint64_t region_bytes = 0;     // reserved for capture families
  // Lower bound on region_bytes: per family, the peak bytes of workspaces live at once in its
  // largest capture (workspaces released during a capture give their range to later requests).
  std::uint64_t region_peak_live_bytes = 0;
  std::uint64_t families = 0;         // families holding a region
  std::uint64_t live_graphs = 0;
  std::uint64_t active_captures = 0;
};

// A set of graphs replayed one at a time on one stream (one per batch bucket, as engines do).
// They share one region sized by their largest plan.
class CaptureFamily {
 public:
  const std::string& name() const;
  std::uint64_t region_bytes() const;   // current size of the shared region
  std::uint64_t graphs() const;         // live graphs of the family
  std::uint64_t largest_plan_bytes() const;
  std::uint64_t sum_of_plan_bytes() const;  // what separate regions would have cost
  std::uint64_t peak_live_bytes() const;    // lower bound on the region: the largest plan's peak live bytes

 private:
  friend struct detail::InternalAccess;
  explicit CaptureFamily(std::shared_ptr<detail::Family> f) : f_(std::move(f)) {}  // made by Arena::family
  std::shared_ptr<detail::Family> f_;
};

class Arena {
 public:
  explicit Arena(Backend& backend, ArenaOptions opts = {});
  ~Arena();
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  // Make sure a free block of at least `bytes` exists (adds a slab if not). Outside capture only.
  void reserve(std::uint64_t bytes, Stream s);

  // A workspace of policy.size(need) elements of `element_bytes` each.
  Workspace request(Stream s, std::string_view name, const Extent& need, std::uint64_t element_bytes,
                    const SizingPolicy& policy, const Bindings& b,
                    std::source_location loc = std::source_location::current());

  // A sized dimension: an element count that a captured graph freezes without allocating
  // (a row stride, an offset into a workspace). Recorded and guarded like a request: an offset
  // is a request boundary, so the overlap of the seed's bug is caught even when the total fits.
  std::int64_t dimension(Stream s, std::string_view name, const Extent& need, const SizingPolicy& policy,
                         const Bindings& b, std::source_location loc = std::source_location::current());

  // Opaque byte request (library code that only has a size_t, cuda::mr, Thrust/CUB temporaries).
  // Served and recorded like a request; a debug report flags it when made during capture.
  void* allocate(Stream s, std::uint64_t bytes, std::uint64_t alignment = kAlignment,
                 std::source_location loc = std::source_location::current());
  void deallocate(Stream s, void* p, std::uint64_t bytes);

  // A capture family: graphs passed this family share one region.
  CaptureFamily family(std::string name);

  // Return fully free slabs to the backend. Outside capture only.
  void trim(Stream s);

  // Virtual growth: a request whose touched part is `touched` (Footprint::per_request_ranges, ...)
  // rather than its whole need. Without virtual_memory the footprint is ignored.
  Workspace request(Stream s, std::string_view name, const Extent& need, std::uint64_t element_bytes,
                    const SizingPolicy& policy, const Bindings& b, const Footprint& touched,
                    std::source_location loc = std::source_location::current());
  // Virtual growth: unmap (back to the pool) every mapped granule of this arena's families that
  // `keep_for` does not need in any live graph (graphs it does not fit keep nothing); without
  // bindings, everything. Waits for the families' last replay streams: call it when no replay is
  // in flight, never while capturing. Later replays map again what they need.
  void shrink(Stream s);
  void shrink(Stream s, const Bindings& keep_for);
  // Virtual growth: physical bytes mapped for this arena's captured graphs (0 without it).
  std::uint64_t committed_bytes() const;

  ArenaStats stats() const;
  Backend& backend() const;
  const ArenaOptions& options() const;

 private:
  friend struct detail::InternalAccess;
  std::shared_ptr<detail::ArenaCore> core_;
};

}  // namespace graphsafe
