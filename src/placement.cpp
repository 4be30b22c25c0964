#include "placement.hpp"

#include "arena_core.hpp"
#include "virtual_commit.hpp"

#include <graphsafe/captured_graph.hpp>
#include <graphsafe/error.hpp>

#include <algorithm>

namespace graphsafe::detail {

namespace {

[[noreturn]] void too_large(const SessionState& st, std::string_view name, std::uint64_t end) {
  throw out_of_memory_error("graphsafe: capture of family '" + st.family->name + "' needs " + std::to_string(end) +
                            " bytes for request '" + std::string(name) + "' but only " + std::to_string(st.limit) +
                            " are free in one range (requests during capture never grow the arena); " +
                            (st.family->graphs > 0
                                 ? std::string("the family's region cannot grow past the block after it -- capture "
                                               "the family's largest bucket first so its region is sized by it")
                                 : "call arena.reserve(" + std::to_string(end) + ", stream) before capturing"));
}

// Virtual growth without sharing: one address range per workspace (granule boundaries,
// virtual_commit.hpp), never reused.
class OwnRangesPlacement final : public Placement {
 public:
  Placed request(SessionState& st, const PlacementRequest& r) override {
    std::lock_guard g(st.core->lock);
    std::uint64_t offset = align_up(st.bump, std::max<std::uint64_t>(r.alignment, kAlignment));
    offset = virtual_align(st, offset, r.bytes);
    if (offset + r.bytes > st.limit) too_large(st, r.name, offset + r.bytes);
    st.bump = offset + r.bytes;
    return {offset, 0, {}};
  }
  bool owns(std::uint64_t) const noexcept override { return false; }
  void release(SessionState&, std::uint64_t, void*) override {}
  std::uint64_t serial_at(SessionState&, std::uint64_t, std::uint64_t&) override { return 0; }
  void finish(SessionState& st) override {
    // Nothing shares bytes: the lower bound is the extent itself.
    st.plan.set_peak_live_bytes(align_up(st.bump, kAlignment));
  }
  void estimate(bool, CaptureEstimate& e) override {
    e.region_bytes = e.peak_live_bytes = 0;  // estimates refuse virtual growth before capturing
  }
};

class ReusePlacement final : public Placement {
 public:
  ReusePlacement(ArenaCore& core, std::vector<std::shared_ptr<const LayoutProposal>> proposals, PlannerStorage&& spare)
      : core_(core) {
    planner_.set_proposals(std::move(proposals));
    planner_.adopt(std::move(spare));
  }
  // The planner's vectors go to the arena for its next capture (the larger set is kept).
  ~ReusePlacement() override {
    PlannerStorage s = planner_.take_storage();
    std::lock_guard g(core_.lock);
    if (s.capacity() > core_.spare_planner.capacity()) std::swap(s, core_.spare_planner);
  }

  Placed request(SessionState& st, const PlacementRequest& r) override {
    // Every offset and size is a multiple of 256 (alignments above it are refused), so any range a
    // released block leaves holds any later block that fits its size.
    const std::uint64_t taken = align_up(r.bytes, kAlignment);
    Backend& backend = core_.backend;
    std::lock_guard g(mutex_);
    auto ordered = [&backend](void* stream, std::span<const void* const> position) {
      const std::vector<const void*> before(position.begin(), position.end());
      return backend.capture_ordered_after(Stream(static_cast<cudaStream_t>(stream)), before);
    };
    CapturePlanner::Choice c = planner_.choose(taken, r.stream.handle(), ordered, r.explain);
    Placed p;
    p.offset = c.offset;
    if (st.virt) [[unlikely]] {
      // Virtual sharing: the planner's offset is where the bytes lie physically; the workspace gets
      // its own address range, mapped onto them (virtual_commit.hpp).
      std::lock_guard lk(core_.lock);
      p.offset = virtual_share_place(st, c.offset, r.bytes);
      if (p.offset + r.bytes > st.limit) too_large(st, r.name, p.offset + r.bytes);
      st.bump = p.offset + r.bytes;
    } else if (c.offset + r.bytes > st.limit) {
      too_large(st, r.name, c.offset + r.bytes);
    }
    if (r.explain) {
      p.why_not = std::move(c.why_not);
      // Debug mode: where the request sits in the capture, for the graph audit at instantiation.
      c.request_known = backend.capture_dependencies(r.stream, c.request_position);
    }
    // The name only explains a reuse not proven (debug mode): not copied otherwise.
    if (taken)
      p.serial = planner_.commit(std::move(c), st.plan.entries().size(), r.explain ? std::string(r.name) : std::string());
    if (!st.virt) st.bump = std::max(st.bump, planner_.region());
    return p;
  }

  bool owns(std::uint64_t serial) const noexcept override { return planner_.owns(serial); }

  void release(SessionState&, std::uint64_t serial, void* stream) override {
    std::lock_guard g(mutex_);
    if (PlannedBlock* b = planner_.live(serial)) {
      std::vector<const void*>& position = planner_.scratch();
      const bool known = core_.backend.capture_dependencies(Stream(static_cast<cudaStream_t>(stream)), position);
      planner_.release(*b, stream, position, known);
    }
  }

  std::uint64_t serial_at(SessionState& st, std::uint64_t offset, std::uint64_t& range_bytes) override {
    std::lock_guard g(mutex_);
    const PlannedBlock* b = planner_.live_at(virtual_planner_offset(st, offset));
    if (!b) return 0;
    range_bytes = b->bytes;
    return b->serial;
  }

  void finish(SessionState& st) override {
    std::lock_guard g(mutex_);
    planner_.finish_lifetimes();
    const CapturePlanner& p = planner_;
    st.plan.set_peak_live_bytes(p.clique_bound());
    if (st.virt) st.plan.set_physical_bytes(align_up(p.region(), kAlignment));
    const auto& blocks = p.blocks();
    for (const PlannedBlock& b : blocks) {
      PlanEntry& e = st.plan.entry(b.entry);
      e.stream = b.stream;
      e.released = b.released;
      e.physical_offset = b.offset;
    }
    // Entries whose range (guard included) another entry's range overlaps: debug canaries and NVTX
    // regions skip them (their bytes legitimately hold another workspace's data during a replay).
    std::vector<char> shares, reuses;
    p.sharing(shares, reuses);
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      st.plan.entry(blocks[i].entry).shares_bytes = shares[i];
      st.plan.entry(blocks[i].entry).reuses = reuses[i];
    }
    if (st.virt || blocks.empty()) return;
    std::lock_guard lk(core_.lock);
    keep_layout(st.family->layouts, p);  // packed offline only once a later capture follows it
  }

  void estimate(bool family, CaptureEstimate& e) override {
    std::lock_guard g(mutex_);
    // A family's next capture follows the best layout (same sizes); a graph of its own places greedily.
    e.region_bytes = align_up(family ? planner_.best().region : planner_.region(), kAlignment);
    e.peak_live_bytes = planner_.clique_bound();
  }

  const CapturePlanner* planner() const override { return &planner_; }

 private:
  ArenaCore& core_;
  CapturePlanner planner_;
};

}  // namespace

std::unique_ptr<Placement> make_placement(ArenaCore& core, SessionState& st) {
  if (st.virt && !virtual_shares(st)) return std::make_unique<OwnRangesPlacement>();
  std::vector<std::shared_ptr<const LayoutProposal>> proposals;
  PlannerStorage spare;
  {
    // Earlier captures of this family's function: followed while the sizes match.
    std::lock_guard g(core.lock);
    proposals = st.family->layouts;
    spare = std::move(core.spare_planner);
  }
  return std::make_unique<ReusePlacement>(core, std::move(proposals), std::move(spare));
}

}  // namespace graphsafe::detail
