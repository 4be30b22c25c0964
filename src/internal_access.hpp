// The private state behind the public handles, for the library's own sources and its tests. The
// public headers expose no detail:: type; they befriend InternalAccess, and only code that includes
// this header (from src/, never installed) can reach through them.
#pragma once

#include <graphsafe/arena.hpp>
#include <graphsafe/captured_graph.hpp>

#include <memory>

namespace graphsafe::detail {

class ArenaCore;
struct Family;
struct GraphState;

struct InternalAccess {
  static ArenaCore& core(const Arena& a) noexcept { return *a.core_; }
  static GraphState* graph(const CapturedGraph& g) noexcept { return g.state_.get(); }
  static const std::shared_ptr<Family>& family(const CaptureFamily& f) noexcept { return f.f_; }
  static CaptureFamily make_family(std::shared_ptr<Family> f) { return CaptureFamily(std::move(f)); }
};

// The arena's core (free list, lock, sessions, observers).
inline ArenaCore& core_of(const Arena& a) noexcept { return InternalAccess::core(a); }
// The graph's state; nullptr for a graph moved from.
inline GraphState* impl_of(const CapturedGraph& g) noexcept { return InternalAccess::graph(g); }
// The family's state.
inline const std::shared_ptr<Family>& impl_of(const CaptureFamily& f) noexcept { return InternalAccess::family(f); }
// A handle on a family (Arena::family makes new ones; graphs name theirs).
inline CaptureFamily family_handle(std::shared_ptr<Family> f) { return InternalAccess::make_family(std::move(f)); }

}  // namespace graphsafe::detail
