// CapturePlanner: where a capture's requests go inside its region.
//
//   CapturePlanner p;
//   auto a = p.choose(bytes, stream, ordered, explain);   // offset, conflicts, lower bound
//   std::uint64_t serial = p.commit(a, entry, name);
//   ... p.release(*p.live(serial), stream, position, known);  // the range may now be reused
//   PackedLayout better = p.pack();                       // offline, over the recorded lifetimes
//
// A released workspace's range is reused by a later request of the same capture only when the
// captured graph orders every use of the old workspace before every use of the new one: the new
// request is on the releasing stream, or its stream's capture dependencies reach the releasing
// stream's position at release (the `Ordered` oracle asks the backend). Unproven means no reuse.
// Placement is best fit among the ranges of the blocks the request conflicts with (those live, and
// those released but not ordered before it), so it never depends on how the free ranges were split.
//
// The lower bound is the weight of a clique of pairwise-conflicting blocks (any placement must give
// them disjoint bytes): at each request, the blocks live in capture order plus the released ones
// still unordered with it that conflict with all of those. On one stream it is exactly the peak
// live bytes; blocks live on concurrent branches count together.
//
// The policy behind ReusePlacement (src/placement.hpp); growth (slabs, virtual memory) and debug
// checks are other components.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <functional>
#include <limits>
#include <memory>
#include <span>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace graphsafe::detail {

// A stream's capture dependencies at one point (node handles), kept in the planner's pool.
struct PositionRef {
  std::uint32_t begin = 0;
  std::uint32_t count = 0;
};

// Kept small and trivially movable (a capture can hold thousands): names and positions live in
// the planner's side tables.
struct PlannedBlock {
  std::uint64_t serial = 0;  // the handle's id (Workspace, opaque pointer); unique over the process
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;  // range taken: guard included, 256-byte aligned
  void* stream = nullptr;
  void* release_stream = nullptr;
  std::size_t entry = 0;  // index of its plan entry
  PositionRef release_position;  // the releasing stream's capture dependencies at release
  // Debug mode: the requesting stream's capture dependencies at the request (the graph audit).
  PositionRef request_position;
  bool released = false;
  bool position_known = false;
  bool request_known = false;
};

// One offset per block, in request order: a placement a later capture of the same function follows.
struct PackedLayout {
  std::vector<std::uint64_t> bytes;
  std::vector<std::uint64_t> offsets;
  std::uint64_t region = 0;
};

// What a packing needs of a capture, per block in request order: its size, where it was placed,
// and which earlier blocks it conflicts with, as capture-order times (no list per block: the live
// ones follow from the times, and releases not ordered before it are rare).
struct Lifetimes {
  std::vector<std::uint64_t> bytes;
  std::vector<std::uint64_t> offsets;
  // Capture order of each block's request and release (kNever: not released). An earlier block
  // conflicts with a later one when it is released after the later one's request (both live at
  // once), or when its release is not ordered before it (listed in unordered_before, sorted).
  static constexpr std::uint64_t kNever = ~0ull;
  std::vector<std::uint64_t> requested_at;
  std::vector<std::uint64_t> released_at;
  std::vector<std::vector<std::uint32_t>> unordered_before;
  std::uint64_t region = 0;
  // Every conflict is between blocks live at once in capture order (no release left unordered):
  // the conflict graph is an interval graph, whose heaviest clique is the live set at a request.
  bool intervals = true;
};
// Whether blocks a < b conflict, and each block's earlier conflicting blocks (sorted).
bool conflicts(const Lifetimes& l, std::uint32_t a, std::uint32_t b);
std::vector<std::vector<std::uint32_t>> conflicts_before(const Lifetimes& l);
// The heaviest clique of the conflict graph found by a bounded search, at least `floor`.
std::uint64_t clique_bound(const Lifetimes& l, std::uint64_t floor);
// An offline packing of the lifetimes (best fit by decreasing size, by decreasing size x
// conflicts, then perturbations while above the clique bound).
PackedLayout pack(const Lifetimes& l, std::uint64_t floor);

// A family's layout for its later captures: the block sizes, which a capture follows while its own
// match, and the better of the placement made and an offline packing. The packing runs the first
// time a capture follows the layout, not when it is recorded: most layouts are never followed
// (bucket graphs differ in sizes from their first request), and packing is the costly part.
class LayoutProposal {
 public:
  LayoutProposal(std::shared_ptr<const Lifetimes> l, std::uint64_t floor) : lifetimes_(std::move(l)), floor_(floor) {}
  const std::vector<std::uint64_t>& bytes() const { return lifetimes_->bytes; }
  // The smallest region known without packing now: the packing's once done, else the placement's.
  std::uint64_t known_region() const;
  const PackedLayout& best() const;  // packs on the first call (thread-safe)

 private:
  std::shared_ptr<const Lifetimes> lifetimes_;  // shared with the capture's planner, which has ended
  std::uint64_t floor_;
  mutable std::once_flag once_;
  mutable std::atomic<bool> packed_{false};
  mutable PackedLayout best_;
};

// Records a capture's layout with its family: one per sequence of block sizes, the smallest known
// region kept, at most 16.
class CapturePlanner;
void keep_layout(std::vector<std::shared_ptr<const LayoutProposal>>& layouts, const CapturePlanner& p);

// A planner's growing vectors, handed from an ended capture to the next one (ArenaCore keeps one
// set): a capture of thousands of requests then neither regrows them nor faults their pages in.
struct PlannerStorage {
  std::vector<PlannedBlock> blocks;
  std::vector<const void*> positions;
  std::vector<std::uint32_t> live;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live_ranges;
  std::size_t last_blocks = 0;  // blocks of the capture that used them last
  std::size_t capacity() const { return blocks.capacity(); }
};

class CapturePlanner {
 public:
  // Serials of this planner's blocks start at a base of their own: `live` finds a block by index.
  CapturePlanner();
  // Whether the graph orders a release at `position` (a stream's capture dependencies at release)
  // before the next work captured on `stream`.
  using Ordered = std::function<bool(void* stream, std::span<const void* const> position)>;

  struct Choice {
    std::uint64_t offset = 0;
    std::uint64_t bytes = 0;
    void* stream = nullptr;
    std::vector<std::uint32_t> ordered;    // released blocks newly proven ordered before this stream
    std::vector<std::uint32_t> unordered;  // released blocks not ordered before it (sorted)
    std::uint64_t clique = 0;              // lower bound at this request
    std::string why_not;                   // explain: released ranges this request could not prove safe to reuse
    bool request_known = false;          // debug mode: set by the caller before commit
    std::vector<const void*> request_position;
  };
  // Where a request of `bytes` (aligned, guard included) on `stream` goes. Follows `proposals`
  // (layouts of earlier captures) when one fits this capture's conflicts.
  Choice choose(std::uint64_t bytes, void* stream, const Ordered& ordered, bool explain) const;
  // Records the block chosen; returns its serial. `name` (debug mode) explains later reuses not proven.
  std::uint64_t commit(Choice&& c, std::size_t entry, std::string name);
  // Before the first request: take over `s`'s capacity (its contents are dropped).
  void adopt(PlannerStorage&& s);
  // After the capture: the vectors, for the next capture's adopt.
  PlannerStorage take_storage();
  // The capture ended: lifetimes reserved well past their size (after a larger capture) shrink.
  void finish_lifetimes();
  // Whether `serial` is one of this planner's (read without its lock: the base never changes).
  bool owns(std::uint64_t serial) const { return serial - base_ < kMaxBlocks; }
  // The live block with this serial (nullptr: not this capture's, or already released).
  PlannedBlock* live(std::uint64_t serial);
  // The live block at this offset (opaque deallocate), nullptr when none.
  PlannedBlock* live_at(std::uint64_t offset);
  // Per block: whether another block's range overlaps its range (shares), and whether an earlier
  // one does (reuses). O(n log n): an interval union swept forwards, then backwards.
  void sharing(std::vector<char>& shares, std::vector<char>& reuses) const;
  // `position` is copied (the caller's scratch() may be passed).
  void release(PlannedBlock& b, void* stream, std::span<const void* const> position, bool known);
  // A vector to ask the backend for a position into, reused from call to call.
  std::vector<const void*>& scratch() { return scratch_; }
  std::span<const void* const> position(PositionRef r) const { return {positions_.data() + r.begin, r.count}; }
  // The name given at commit (debug mode), empty otherwise.
  const std::string& name(std::size_t block) const;

  std::uint64_t region() const { return region_; }
  // Lower bound: the greedy cliques recorded at each request (peak live bytes in capture order).
  std::uint64_t peak_live() const { return peak_; }
  // A tighter lower bound: the heaviest clique of the conflict graph found by a bounded search.
  std::uint64_t clique_bound() const;
  const std::vector<PlannedBlock>& blocks() const { return blocks_; }

  // Layouts of earlier captures of this function: followed while their block sizes match.
  void set_proposals(std::vector<std::shared_ptr<const LayoutProposal>> p) {
    proposals_ = std::move(p);
    following_.assign(proposals_.size(), 1);
  }
  // The placement made, and an offline packing of the same lifetimes (best fit by decreasing size,
  // and by decreasing size x conflicts); the smaller of the three.
  PackedLayout layout() const;
  PackedLayout pack() const;
  PackedLayout best() const;
  const Lifetimes& lifetimes() const { return *lt_; }
  // Shared, not copied: the planner adds no block once its capture has ended.
  std::shared_ptr<const Lifetimes> shared_lifetimes() const { return lt_; }

 private:
  bool conflict(std::uint32_t a, std::uint32_t b) const;  // a != b
  // A stream that requested in this capture, and the released blocks (released on other streams)
  // not yet proven ordered before its next work. A stream's capture dependencies only move
  // forward, so a block once proven ordered stays so and is asked about once per stream.
  struct StreamView {
    void* stream = nullptr;
    std::vector<std::uint32_t> pending;
  };
  const StreamView* view(void* stream) const;
  PositionRef keep_position(std::span<const void* const> p);
  static constexpr std::uint64_t kMaxBlocks = 1ull << 32;
  std::uint64_t base_;  // serial of block 0
  std::vector<PlannedBlock> blocks_;
  std::vector<const void*> positions_;  // every PositionRef's nodes
  std::vector<const void*> scratch_;
  std::vector<std::string> names_;  // by block, only up to the last named one
  std::shared_ptr<Lifetimes> lt_ = std::make_shared<Lifetimes>();
  std::vector<StreamView> streams_;
  std::vector<std::uint32_t> live_;  // blocks not released (request order)
  std::uint64_t live_bytes_ = 0;
  std::uint64_t clock_ = 0;  // capture order of requests and releases
  std::vector<std::pair<std::uint64_t, std::uint64_t>> live_ranges_;  // their (offset, bytes), sorted
  // Best fit against the live ranges alone (disjoint, sorted): best_fit_sorted(live_ranges_, bytes).
  std::uint64_t best_fit_live(std::uint64_t bytes) const;
  std::uint64_t region_ = 0;
  std::uint64_t peak_ = 0;
  std::vector<std::shared_ptr<const LayoutProposal>> proposals_;
  std::vector<char> following_;  // per proposal: every block so far was placed as it says
};

// Best fit among `taken` ranges (offset, bytes): the smallest gap that holds `bytes`, else the end
// of the highest range.
std::uint64_t best_fit(std::vector<std::pair<std::uint64_t, std::uint64_t>> taken, std::uint64_t bytes);
std::uint64_t best_fit_sorted(const std::vector<std::pair<std::uint64_t, std::uint64_t>>& taken, std::uint64_t bytes);
// The lowest gap that holds `bytes`.
std::uint64_t first_fit_offset(std::vector<std::pair<std::uint64_t, std::uint64_t>> taken, std::uint64_t bytes);

}  // namespace graphsafe::detail
