// Placement: where a capture's requests go inside its region. One per capture, chosen when the
// capture has its region (SessionState::placement); the arena asks it and nothing else:
//
//   Placed p = st.placement->request(st, {bytes, alignment, stream, name, explain});  // offset, serial
//   st.placement->release(p.serial, stream);       // a workspace released during the capture
//   st.placement->finish(st);                      // lifetimes, lower bound, layout: plan and family
//
// - ReusePlacement: the CapturePlanner (src/capture_planner.hpp) places each request by best fit,
//   reusing ranges released earlier in the capture when the graph orders the release first, or
//   following the layout of an earlier capture of the family (offline packing). Slab regions, and
//   virtual growth with sharing (the planner's offset is physical; the region provider's
//   virtual_share_place gives the workspace its own addresses over it).
// - OwnRangesPlacement: virtual growth without sharing; every workspace its own granule-aligned
//   range after the last one, never reused.
//
// `st.bump` stays the capture's extent (the end of the highest range placed), which growth reads
// when the capture ends.
#pragma once

#include "capture_planner.hpp"

#include <graphsafe/stream.hpp>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

namespace graphsafe {
struct CaptureEstimate;
}

namespace graphsafe::detail {

class ArenaCore;
struct SessionState;

struct PlacementRequest {
  std::uint64_t bytes = 0;      // guard included
  std::uint64_t alignment = 0;  // a power of two <= 256
  Stream stream{static_cast<cudaStream_t>(nullptr)};
  std::string_view name;        // for the out-of-memory message and (debug) reuse explanations
  bool explain = false;         // debug mode: say why a released range was not reused
};

struct Placed {
  std::uint64_t offset = 0;  // from the region base: where the workspace's addresses start
  std::uint64_t serial = 0;  // what a release names (0: the range is never reused)
  std::string why_not;       // explain: released ranges not proven safe to reuse
};

class Placement {
 public:
  virtual ~Placement() = default;
  // Places a request (throws out_of_memory_error past the region's limit). Called in request order
  // (plan entries are added after it: st.plan.entries().size() is this request's entry).
  virtual Placed request(SessionState& st, const PlacementRequest& r) = 0;
  // Whether `serial` is one of this placement's (no lock: read while other captures run).
  virtual bool owns(std::uint64_t serial) const noexcept = 0;
  // The workspace with this serial was released on `stream`: its range may be reused by later
  // requests once ordered. A serial released already, or not live, is ignored.
  virtual void release(SessionState& st, std::uint64_t serial, void* stream) = 0;
  // The serial of the live workspace whose addresses start at `offset` (deallocate of an opaque
  // pointer) and the bytes of its range; 0 when none.
  virtual std::uint64_t serial_at(SessionState& st, std::uint64_t offset, std::uint64_t& range_bytes) = 0;
  // The capture ended: each entry's stream, release and sharing, the lower bound (and physical
  // bytes under virtual sharing) into the plan; the best layout to the family.
  virtual void finish(SessionState& st) = 0;
  // An estimate ended: the region a capture of the family (or a graph of its own) takes, and the
  // lower bound.
  virtual void estimate(bool family, CaptureEstimate& e) = 0;
  // The planner behind a reusing placement (debug mode's graph audit reads its blocks under
  // mutex()), nullptr when ranges are never reused.
  virtual const CapturePlanner* planner() const { return nullptr; }
  std::mutex& mutex() { return mutex_; }

 protected:
  // Guards the placement's state; ordering queries to the backend run under it, never under the
  // arena's spin lock.
  std::mutex mutex_;
};

// The placement for a capture whose region the region provider has just set up (st.virt says
// which growth), following the family's earlier layouts.
std::unique_ptr<Placement> make_placement(ArenaCore& core, SessionState& st);

}  // namespace graphsafe::detail
