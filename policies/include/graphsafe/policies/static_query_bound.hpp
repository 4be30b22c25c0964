// static_query_bound: reserve a bound written in static symbols only, such as the static query
// tensor captured in the graph (SWA rows <= tokens_in_graph * window). The bound is verified when a
// request uses it: it must reference no dynamic symbol, must cover the need at request time, and is
// clamped to the capacity bound when one exists (never reserve more than capacity_bound would).
#pragma once

#include <graphsafe/sizing_policy.hpp>

namespace graphsafe {

class StaticQueryBound final : public SizingPolicy {
 public:
  explicit StaticQueryBound(Extent bound) : bound_(std::move(bound)) {}
  std::string_view name() const override { return "static-query-bound"; }
  SizingDecision size(std::string_view request, const Extent& need, const Bindings& b,
                      bool capturing) const override;
  const Extent& bound() const { return bound_; }

 private:
  Extent bound_;
};

inline StaticQueryBound static_query_bound(Extent bound) { return StaticQueryBound(std::move(bound)); }

}  // namespace graphsafe
