// Plan: what a capture reserved. One entry per request made while capturing (workspaces, sized
// dimensions such as a row offset, and opaque byte requests), with the extent it needed, the policy
// that sized it, the bytes and offset it got, and where it came from. The plan yields the replay
// guards: before every replay, required(bindings) <= reserved for each entry.
#pragma once

#include <graphsafe/bindings.hpp>
#include <graphsafe/error.hpp>
#include <graphsafe/extent.hpp>
#include <graphsafe/plan_layout.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace graphsafe {

struct PlanEntry {
  enum class Kind : std::uint8_t { workspace, dimension, opaque };
  Kind kind = Kind::workspace;
  std::string name;
  std::string policy;
  std::optional<Extent> need;      // empty for opaque (size_t) requests
  std::int64_t needed_at_capture = 0;
  std::int64_t reserved = 0;       // elements (bytes for opaque requests)
  std::uint64_t element_bytes = 1;
  std::uint64_t bytes = 0;         // 0 for dimensions
  std::uint64_t offset = 0;        // from the start of the family's region
  // Where its bytes lie in the plan's physical layout: `offset`, except under virtual sharing
  // (ArenaOptions::virtual_sharing), where workspaces with disjoint lifetimes overlap physically
  // while each keeps its own addresses (entries with overlapping physical ranges share bytes).
  std::uint64_t physical_offset = kUnsetOffset;
  static constexpr std::uint64_t kUnsetOffset = ~std::uint64_t(0);
  bool replay_safe = false;        // policy proved no replay within capacities needs more
  std::string note;                // policy's reason
  std::string site;                // file:line (function)
  // Lifetime in the capture (workspaces and opaque requests).
  void* stream = nullptr;          // requested on
  bool released = false;           // released during the capture: later requests may reuse its range
  bool reuses = false;             // placed over the range of a workspace released earlier
  bool shares_bytes = false;       // another entry's range overlaps this one's range or guard
};

// A finding made at capture time: a request whose size no bound protects.
struct CaptureFinding {
  std::string request;
  std::string site;
  std::string message;
};

class Plan {
 public:
  const std::vector<PlanEntry>& entries() const { return entries_; }
  const std::vector<CaptureFinding>& findings() const { return findings_; }
  const Bindings& captured_bindings() const { return captured_; }
  std::uint64_t bytes() const { return bytes_; }  // region bytes this plan spans
  // Lower bound on bytes(): peak bytes of workspaces live at once (blocks live on concurrent
  // branches count together), guards and alignment included. bytes() / peak_live_bytes() is what
  // placement costs over the best any placement could do.
  std::uint64_t peak_live_bytes() const { return peak_live_; }
  // Bytes of physical memory the plan's layout spans: bytes(), except under virtual sharing
  // (ArenaOptions::virtual_sharing), where it is the physical layout's extent -- workspaces with
  // disjoint lifetimes overlap in it -- and peak_live_bytes() is its lower bound.
  std::uint64_t physical_bytes() const { return physical_set_ ? physical_ : bytes_; }

  // Guards that replays must pass; empty when every entry is replay-safe by construction.
  std::size_t guard_count() const { return guards_.size(); }
  // Violations of the guards (and of frozen static symbols) for these bindings; empty = safe.
  // Bindings the plan's extents reject throw, whatever policy sized them: an unbound symbol
  // (unbound_symbol_error), a batch vector whose length differs from its length symbol
  // (invalid_argument_error).
  std::vector<GuardViolation> check(const Bindings& b) const;
  // Throws guard_failure with a message naming request, symbol, value and limit.
  void enforce(const Bindings& b) const;
  // Multi-line human report of the plan.
  std::string report() const;
  // Where the plan put its workspaces (graphsafe/plan_layout.hpp): what tensor-parallel ranks
  // compare to prove their captures laid out the same offsets.
  PlanLayout layout() const;

  // Building (used by the capture session).
  void set_captured_bindings(const Bindings& b) { captured_ = b; }
  void add(PlanEntry e);
  void reserve(std::size_t entries) { entries_.reserve(entries); }  // finalize() gives back a large excess
  void add_finding(CaptureFinding f) { findings_.push_back(std::move(f)); }
  void set_bytes(std::uint64_t b) { bytes_ = b; }
  void set_peak_live_bytes(std::uint64_t b) { peak_live_ = b; }
  void set_physical_bytes(std::uint64_t b) {
    physical_ = b;
    physical_set_ = true;
  }
  PlanEntry& entry(std::size_t i) { return entries_.at(i); }
  // Compile guards: entries whose policy proved them replay-safe are discharged (their guard is
  // implied by the bindings being within capacities); identical extents share one guard holding
  // the smallest reservation.
  void finalize();
  // Symbols whose values a replay must supply (dynamic) or keep (static).
  const std::vector<Symbol>& symbols() const { return symbols_; }

 private:
  struct Guard {
    Extent need;
    std::int64_t reserved;
    std::size_t entry;  // index of the entry that reserved the least
  };
  std::vector<PlanEntry> entries_;
  std::vector<CaptureFinding> findings_;
  std::vector<Guard> guards_;
  std::vector<Symbol> symbols_;
  // The dynamic symbols of symbols_, split by kind once (check() asks no registry): every replay
  // must bind them, and each batch vector must have its length symbol's value of elements.
  std::vector<Symbol> scalars_;
  std::vector<std::pair<Symbol, Symbol>> batches_;  // (batch, its length)
  Bindings captured_;
  std::uint64_t bytes_ = 0;
  std::uint64_t peak_live_ = 0;
  std::uint64_t physical_ = 0;
  bool physical_set_ = false;
};

}  // namespace graphsafe
