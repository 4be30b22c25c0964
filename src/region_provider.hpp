// RegionProvider: where a capture family's region comes from, how it grows, and when it goes back.
//
// An arena has one, chosen when it is made: SlabRegions (regions carved from the arena's slabs, the
// default) or VirtualRegions (ArenaOptions::virtual_memory: one address-space reservation per
// family, physical memory mapped behind footprints). The arena's capture lifecycle calls it at the
// three points where growth differs, and nowhere else; placement inside the region
// (src/placement.hpp) and eager requests do not go through it. Capture setup and graph death only: a virtual
// call there costs nothing next to a capture.
#pragma once

#include <memory>

namespace graphsafe::detail {

class ArenaCore;
struct Family;
struct SessionState;

class RegionProvider {
 public:
  virtual ~RegionProvider() = default;
  // Give the capture `st` the range it places into (st.base, st.limit), held for it until
  // end_capture. Throws (changing nothing) when the family is already capturing or no range can be had.
  virtual void begin_capture(SessionState& st) = 0;
  // The capture ended. Success: its used bytes become (or extend) the family's region. Failure:
  // what it held goes back, and so does the family's memory when no graph of it is left.
  virtual void end_capture(SessionState& st, bool success) = 0;
  // A graph of family `f` died (after its executable); `stream` is where its region was last used.
  // A family left with no graph and no capture gives its memory back.
  virtual void graph_destroyed(Family& f, void* stream) noexcept = 0;
};

// Regions inside the arena's slabs, shared with eager requests through one free list
// (ArenaCore::begin_slab_capture / end_slab_capture / graph_destroyed in src/arena.cpp).
class SlabRegions final : public RegionProvider {
 public:
  explicit SlabRegions(ArenaCore& core) : core_(core) {}
  void begin_capture(SessionState& st) override;
  void end_capture(SessionState& st, bool success) override;
  void graph_destroyed(Family& f, void* stream) noexcept override;

 private:
  ArenaCore& core_;
};

// One virtual reservation per family (src/virtual_commit.cpp, docs/virtual_growth.md).
class VirtualRegions final : public RegionProvider {
 public:
  explicit VirtualRegions(ArenaCore& core) : core_(core) {}
  void begin_capture(SessionState& st) override;
  void end_capture(SessionState& st, bool success) override;
  void graph_destroyed(Family& f, void* stream) noexcept override;

 private:
  ArenaCore& core_;
};

// The provider ArenaOptions ask for.
std::unique_ptr<RegionProvider> make_region_provider(ArenaCore& core);

}  // namespace graphsafe::detail
