// Backend: the thin layer under the arena. Everything the arena decides (sub-allocation, plans,
// families, guards) is plain C++ over address ranges; a backend only provides memory, capture
// state and graph launch. Two implementations obey one contract: CudaBackend (stream-ordered
// allocator + CUDA Graphs) and HostBackend (host memory + recorded host graphs), so CI tests the
// allocator's logic without a GPU.
#pragma once

#include <graphsafe/stream.hpp>

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace graphsafe {

enum class CaptureMode : std::uint8_t { global, thread_local_mode, relaxed };

struct CaptureInfo {
  bool active = false;       // stream is capturing right now
  std::uint64_t id = 0;      // unique per capture over the process lifetime (never 0 when active)
  bool invalidated = false;  // capture was started but is now invalid (an illegal call happened)
};

// Opaque handles owned by the backend.
struct GraphHandle {
  void* graph = nullptr;
  void* exec = nullptr;
};

// A captured graph's nodes and dependency edges, as opaque handles: the values
// capture_dependencies gave for the same nodes during the capture.
struct GraphTopology {
  std::vector<const void*> nodes;
  std::vector<std::pair<const void*, const void*>> edges;  // (from, to): `to` depends on `from`
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  // Whether slabs are allocations a tool can see as such (compute-sanitizer accepts NVTX Memory API
  // heaps only on cudaMalloc'd memory, not on stream-ordered pool memory). Debug mode registers
  // NVTX heaps and regions only when this is true, so no registration call is made that fails.
  virtual bool nvtx_heaps_supported() const { return false; }

  // Device memory for the arena's slabs, stream-ordered. Throw out_of_memory_error on failure.
  virtual void* allocate_slab(std::uint64_t bytes, Stream s) = 0;
  virtual void free_slab(void* p, std::uint64_t bytes, Stream s) = 0;

  virtual CaptureInfo capture_info(Stream s) const = 0;
  virtual void begin_capture(Stream s, CaptureMode mode) = 0;
  // Ends the capture and instantiates the graph.
  virtual GraphHandle end_capture(Stream s) = 0;
  // Ends a capture that failed or was abandoned; discards whatever was recorded. Never throws.
  virtual void abort_capture(Stream s) noexcept = 0;
  virtual void launch(const GraphHandle& g, Stream s) = 0;
  virtual void destroy(GraphHandle& g) noexcept = 0;

  // Capture ordering, what lets a capture reuse a released workspace's range on another stream.
  // The graph nodes the next work captured on `s` will depend on (opaque handles); false when the
  // backend cannot tell, and graphsafe then reuses a range only on the stream that released it.
  virtual bool capture_dependencies(Stream s, std::vector<const void*>& out) const;
  // Whether the next work captured on `s` is ordered after every node of `before` (each is one of
  // `s`'s dependencies or an ancestor of one). An empty `before` is trivially ordered. False when
  // the backend cannot tell: unproven means no reuse.
  virtual bool capture_ordered_after(Stream s, const std::vector<const void*>& before) const;
  // The nodes and edges of an ended capture's graph (debug mode's graph audit reads them to check
  // every reuse of a range against the graph itself). False when the backend cannot tell.
  virtual bool graph_topology(const GraphHandle& g, GraphTopology& out) const;

  // Make `waiter` wait for everything issued to `producer` so far (event record + wait).
  virtual void order_after(Stream waiter, Stream producer) = 0;
  virtual void synchronize(Stream s) = 0;

  // Debug mode (canaries, replay audit). Stream-ordered: set `bytes` bytes at `p` to `value`.
  // The default throws: a backend without these cannot run canaries or audit_replay.
  virtual void fill_bytes(void* p, std::uint64_t bytes, std::uint8_t value, Stream s);
  // Stream-ordered copy of backend memory to host memory; `dst` is valid after synchronize(s).
  virtual void copy_to_host(void* dst, const void* src, std::uint64_t bytes, Stream s);
};

}  // namespace graphsafe
