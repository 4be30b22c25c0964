// Virtual growth (ArenaOptions::virtual_memory): per-family address-space reservations, the commit
// map of mapped granules, and each captured graph's footprints with the per-request thresholds
// that make the replay path's check a few integer compares. docs/virtual_growth.md.
//
// Sharing (ArenaOptions::virtual_sharing = disjoint_lifetimes). The contract:
// - Which workspaces share: the capture planner places every captured block (guard included) in a
//   *physical* layout by the ordinary arena's in-capture reuse rule -- a released workspace's bytes
//   go to a later request only when the graph orders every use of the old one before every use of
//   the new one (same stream, or the new stream's capture dependencies reach the release). Blocks
//   whose physical ranges overlap share bytes (PlanEntry::shares_bytes, physical_offset); nothing
//   unproven (another stream without a join) ever shares. Two live workspaces never share a byte.
// - Each workspace's address: its own virtual range, never another's. It starts in a granule of its
//   own, at the same offset inside the granule as its physical offset (va = P mod G), so virtual
//   granule g of the workspace shows physical slot (P + (g*G - va)) / G. A capture's ranges follow
//   the family's earlier captures' ranges (plans do not overlap in address space, unlike without
//   sharing); all captures of a family number their physical slots from 0, so the family's graphs,
//   which never run concurrently, share slots as they share a region in the ordinary arena.
// - Physical bytes: a slot's chunk is created (or taken from the pool) when the first granule
//   showing it is mapped; further granules alias it (VirtualMemory::alias); it goes back to the pool
//   when the last one is unmapped. So the family's physical commit follows the physical layout
//   (Plan::physical_bytes, at least Plan::peak_live_bytes) while the mapped address space follows
//   the sum of the footprints.
#pragma once

#include <graphsafe/bindings.hpp>
#include <graphsafe/extent.hpp>
#include <graphsafe/footprint.hpp>
#include <graphsafe/stream.hpp>
#include <graphsafe/virtual_memory.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace graphsafe::detail {

class ArenaCore;
struct Family;
struct SessionState;
struct VirtualPlan;

// One family's address range and what is mapped in it. Graphs of a family overlap in the range
// (plans start at offset 0), so they share the mapped granules.
struct VirtualFamily {
  std::shared_ptr<VirtualMemory> vm;
  std::weak_ptr<ArenaCore> core;  // debug mode: NVTX heap registration
  std::string name;
  std::uintptr_t base = 0;
  std::uint64_t va_bytes = 0;
  std::uint64_t granule = 0;
  mutable std::mutex m;
  std::vector<std::uint64_t> chunk;  // per granule: chunk handle + 1, 0 = unmapped (grows lazily)
  std::uint64_t mapped = 0;          // granules mapped
  std::atomic<std::uint64_t> epoch{1};  // bumped when anything is unmapped (thresholds go stale)
  std::vector<VirtualPlan*> plans;      // live graphs' plans
  // Sharing (see the top of this file): per granule, the physical slot it shows + 1 (0: a chunk of
  // its own); per slot, its chunk + 1 (0: none) and how many granules show it now.
  std::vector<std::uint64_t> slot_of;
  std::vector<std::uint64_t> slot_chunk;
  std::vector<std::uint64_t> slot_maps;
  std::uint64_t physical = 0;  // distinct chunks held (granules mapped, aliases counted once)
  std::uint64_t va_next = 0;   // sharing: where the next capture's range starts (granule-aligned)

  ~VirtualFamily();
  // Under m. Map the granules covering [off, off + len) that are not mapped; returns how many.
  std::uint64_t commit(std::uint64_t off, std::uint64_t len);
  bool is_mapped(std::uint64_t granule_index) const {
    return granule_index < chunk.size() && chunk[granule_index] != 0;
  }
  // Under m. End of the mapped run starting at `off`'s granule, clamped to `limit` (`off` when
  // that granule is not mapped).
  std::uint64_t covered_end(std::uint64_t off, std::uint64_t limit) const;
  // Under m. Unmap every mapped granule for which keep[g] is false (keep may be shorter: false).
  void unmap_except(const std::vector<bool>& keep);
  bool is_shared(std::uint64_t granule_index) const {
    return granule_index < slot_of.size() && slot_of[granule_index] != 0;
  }
  // Under m. Forget the slots of granules from `first` on (all unmapped); everything when 0.
  void forget_slots(std::uint64_t first);
};

struct VirtualItem {
  enum class Kind : std::uint8_t { fixed, prefix, per_request };
  Kind kind = Kind::fixed;
  std::string name;
  std::uint64_t offset = 0;         // bytes from the family's base
  std::uint64_t phys = 0;           // sharing: offset of its bytes in the plan's physical layout
  std::uint64_t bytes = 0;          // reserved bytes (the workspace)
  std::uint64_t extra = 0;          // bytes after it always mapped (debug mode's guard region)
  std::uint64_t element_bytes = 1;
  std::uint64_t fixed_bytes = 0;    // fixed: bytes touched (static)
  std::optional<Extent> length;     // prefix: elements touched
  std::int64_t prefix_ok = -1;      // prefix: elements known mapped (fast check)
  // prefix whose length is monotone in every dynamic symbol (sum_over(L, ...) of a ragged layout):
  // values up to these thresholds need nothing new, so the fast check is a compare per element
  // instead of evaluating the length. Recomputed (a binary search for the headroom) when exceeded.
  bool mono = false;
  bool mono_valid = false;
  std::vector<Symbol> mono_batch, mono_scalar;
  std::vector<std::vector<std::int64_t>> mono_thr;  // per batch symbol, per element
  std::vector<std::int64_t> mono_scalar_ok;          // per dynamic scalar
  std::optional<Symbol> batch, elem;  // per_request
  std::uint64_t stride_bytes = 0;
  std::size_t count = 0;            // batch length at capture
  struct Range {
    std::uint64_t offset_bytes;
    Extent length;  // elements, in `elem`
  };
  std::vector<Range> ranges;
};

struct VirtualGate {
  Symbol batch;
  std::vector<std::int64_t> thr;    // per request: values up to this need nothing new
  std::vector<std::size_t> items;   // per_request items over this batch symbol
};

struct VirtualPlan {
  std::shared_ptr<VirtualFamily> fam;
  std::vector<VirtualItem> items;
  std::vector<VirtualGate> gates;
  std::vector<std::size_t> prefix_items;  // dynamic prefix items
  std::vector<std::pair<std::uint64_t, std::uint64_t>> gaps;  // placed bytes no item describes
  std::uint64_t placed_to = 0;   // end of the last item (gap tracking during capture)
  // Sharing: the plan's items show physical slots (see the top of this file). Offsets handed to the
  // hooks, placed_to and gaps are from the capture's base, which is the family's base + va_start.
  bool shared = false;
  std::uint64_t va_start = 0;
  std::mutex phys_m;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> phys_at;  // (address offset, physical offset)
  std::uint64_t epoch = 0;       // family epoch the thresholds hold for (0: none yet)
  bool registered = false;
  std::uint64_t fast = 0, slow = 0, grew = 0;
  // Set when the family unmapped anything since the graph last looked: its debug guard regions may
  // be unmapped, or mapped again over pooled chunks holding anything (re-arm before the next launch,
  // nothing to check until then).
  std::atomic<bool> guards_unmapped{false};

  VirtualPlan() = default;
  VirtualPlan(const VirtualPlan&) = delete;
  VirtualPlan& operator=(const VirtualPlan&) = delete;
  ~VirtualPlan();

  // Map what `b` needs that is not mapped, and recompute the thresholds that moved. `full`:
  // everything (first replay, after a shrink).
  void commit_slow(const Bindings& b, bool full);
  // Mark the granules `b` needs (for shrink); false when `b` does not fit this graph.
  bool mark_needed(const Bindings& b, std::vector<bool>& keep) const;
  // Exact bytes, touched granules and separately addressed ranges under `b` (stats).
  void need_of(const Bindings& b, std::uint64_t& exact, std::uint64_t& granules, std::uint64_t& ranges) const;
};

// Monotone prefix: are the bindings' values all within the thresholds (nothing new to map)?
inline bool prefix_within(const VirtualItem& it, const Bindings& b) {
  if (!it.mono_valid) return it.length->evaluate(b) <= it.prefix_ok;
  for (std::size_t k = 0; k < it.mono_batch.size(); ++k) {
    const std::span<const std::int64_t> v = b.values(it.mono_batch[k]);
    const std::vector<std::int64_t>& t = it.mono_thr[k];
    if (v.size() != t.size()) return false;
    bool grew = false;
    for (std::size_t i = 0; i < v.size(); ++i) grew |= v[i] > t[i];
    if (grew) return false;
  }
  for (std::size_t k = 0; k < it.mono_scalar.size(); ++k)
    if (b.value(it.mono_scalar[k]) > it.mono_scalar_ok[k]) return false;
  return true;
}

// The replay path (after the guards): nothing grew -> a compare per request, per gate.
inline void virtual_commit(VirtualPlan& p, const Bindings& b) {
  if (p.epoch != p.fam->epoch.load(std::memory_order_acquire)) [[unlikely]]
    return p.commit_slow(b, true);
  for (const VirtualGate& g : p.gates) {
    const std::span<const std::int64_t> v = b.values(g.batch);
    if (v.size() != g.thr.size()) [[unlikely]]
      return p.commit_slow(b, true);  // reports the mismatch
    const std::int64_t* t = g.thr.data();
    bool grew = false;
    for (std::size_t i = 0; i < v.size(); ++i) grew |= v[i] > t[i];
    if (grew) [[unlikely]]
      return p.commit_slow(b, false);
  }
  for (std::size_t i : p.prefix_items)
    if (!prefix_within(p.items[i], b)) [[unlikely]]
      return p.commit_slow(b, false);
  ++p.fast;
}

// Debug mode: true (once) when the graph's guard regions must be re-armed before its next launch.
inline bool virtual_guards_unmapped(VirtualPlan& p) {
  return p.guards_unmapped.load(std::memory_order_relaxed) && p.guards_unmapped.exchange(false);
}

// The arena's virtual families (for shrink), held by ArenaCore::virt.
struct VirtualRegistry {
  std::mutex m;
  std::vector<std::weak_ptr<Family>> families;
};

// Hooks from the arena (called only when ArenaOptions::virtual_memory is set).
// Where a captured block of `bytes` placed at (256-aligned) `offset` goes in virtual mode: at the
// next granule boundary when it would otherwise start inside a granule and cross into the next one
// (every workspace of a granule or more starts on a boundary, a smaller one never straddles two).
// So a workspace whose need is a prefix maps ceil(need / granule) granules: less than its need plus
// one granule (docs/virtual_growth.md, "The target"). The padding is address space only: it is
// never mapped. Called by OwnRangesPlacement (src/placement.cpp) under the arena's lock.
std::uint64_t virtual_align(SessionState& st, std::uint64_t offset, std::uint64_t bytes);
// Virtual sharing: where a captured block the planner placed at physical offset `phys` goes in
// the capture's address range (a granule of its own, at phys's offset inside its granule). Called
// by ReusePlacement (src/placement.cpp) under the placement's and the arena's locks.
std::uint64_t virtual_share_place(SessionState& st, std::uint64_t phys, std::uint64_t bytes);
// The planner's (physical) offset of a block at address offset `va` of the capture (the same offset
// without sharing).
std::uint64_t virtual_planner_offset(SessionState& st, std::uint64_t va);
bool virtual_shares(const SessionState& st);
void virtual_begin_session(ArenaCore& core, SessionState& st);
void virtual_end_session(ArenaCore& core, SessionState& st, bool success);
void virtual_place(SessionState& st, std::uint64_t offset, std::uint64_t bytes, std::uint64_t extra,
                   std::uint64_t element_bytes, const Extent& need, const Footprint* touched, const Bindings& b,
                   std::string_view name);
void virtual_place_bytes(SessionState& st, std::uint64_t offset, std::uint64_t bytes, std::string_view name);
void virtual_graph_destroyed(ArenaCore& core, Family& f) noexcept;

}  // namespace graphsafe::detail
