#include "region_provider.hpp"

#include "arena_core.hpp"
#include "virtual_commit.hpp"

namespace graphsafe::detail {

void SlabRegions::begin_capture(SessionState& st) { core_.begin_slab_capture(st); }
void SlabRegions::end_capture(SessionState& st, bool success) { core_.end_slab_capture(st, success); }
void SlabRegions::graph_destroyed(Family& f, void* stream) noexcept { core_.graph_destroyed(f, stream); }

void VirtualRegions::begin_capture(SessionState& st) { virtual_begin_session(core_, st); }
void VirtualRegions::end_capture(SessionState& st, bool success) { virtual_end_session(core_, st, success); }
void VirtualRegions::graph_destroyed(Family& f, void* stream) noexcept {
  core_.graph_destroyed(f, stream);  // the arena's counts (a virtual family holds no slab region)
  virtual_graph_destroyed(core_, f);  // an idle family's chunks go back to the pool
}

std::unique_ptr<RegionProvider> make_region_provider(ArenaCore& core) {
  if (core.opts.virtual_memory) return std::make_unique<VirtualRegions>(core);
  return std::make_unique<SlabRegions>(core);
}

}  // namespace graphsafe::detail
