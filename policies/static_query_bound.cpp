#include <graphsafe/error.hpp>
#include <graphsafe/policies/static_query_bound.hpp>

#include <algorithm>

namespace graphsafe {

SizingDecision StaticQueryBound::size(std::string_view request, const Extent& need, const Bindings& b,
                                      bool /*capturing*/) const {
  const std::string req(request);
  if (auto dyn = bound_.dynamic_symbols(); !dyn.empty())
    throw policy_refusal("graphsafe: static-query-bound for request '" + req + "' is written with dynamic symbol '" +
                         dyn.front().name() + "' (" + bound_.to_string() +
                         "); a static bound may use only static symbols (batch size, query tokens, window)");
  std::int64_t count = bound_.evaluate(b);
  std::string note = "static bound " + bound_.to_string() + " = " + std::to_string(count);
  // Never above the capacity bound: when one exists it is also safe, and may be tighter.
  if (need.monotone()) {
    bool all_capped = true;
    for (Symbol s : need.dynamic_symbols()) all_capped = all_capped && s.capacity().has_value();
    if (all_capped) {
      const std::int64_t cap = need.capacity_bound(b);
      if (cap < count) {
        note += ", clamped to the capacity bound " + std::to_string(cap);
        count = cap;
      }
    }
  }
  const std::int64_t now = need.evaluate(b);
  if (now > count)
    throw policy_refusal("graphsafe: static-query-bound for request '" + req + "' gives " + std::to_string(count) +
                         " but the request needs " + std::to_string(now) + " now (" + need.to_string() +
                         "); the bound " + bound_.to_string() + " does not bound the need -- fix the bound or use capacity_bound");
  // The bound is verified against the need only at the current bindings; the guard checks every replay.
  bool safe = false;
  if (need.monotone()) {
    bool all_capped = true;
    for (Symbol s : need.dynamic_symbols()) all_capped = all_capped && s.capacity().has_value();
    safe = all_capped && need.capacity_bound(b) <= count;
  }
  return {count, safe, std::move(note)};
}

}  // namespace graphsafe
