#include <graphsafe/error.hpp>
#include <graphsafe/policies/static_query_bound.hpp>

namespace graphsafe {

namespace {
// Built only when capturing, out of the eager path's frame.
[[gnu::noinline, gnu::cold]] std::string static_note(const Extent& bound, const Bindings& b, bool clamped,
                                                     std::int64_t cap) {
  std::string note = "static bound " + bound.to_string() + " = " + std::to_string(bound.evaluate(b));
  if (clamped) note += ", clamped to the capacity bound " + std::to_string(cap);
  return note;
}
}  // namespace

SizingDecision StaticQueryBound::size(std::string_view request, const Extent& need, const Bindings& b,
                                      bool capturing) const {
  if (!bound_.is_static()) {
    const auto dyn = bound_.dynamic_symbols();
    throw policy_refusal("graphsafe: static-query-bound for request '" + std::string(request) +
                         "' is written with dynamic symbol '" + dyn.front().name() + "' (" + bound_.to_string() +
                         "); a static bound may use only static symbols (batch size, query tokens, window)");
  }
  std::int64_t count = bound_.evaluate(b);
  // Never above the capacity bound: when one exists it is also safe, and may be tighter.
  const bool capped = need.has_capacity_bound();
  const std::int64_t cap = capped ? need.capacity_bound(b) : -1;
  const bool clamped = capped && cap < count;
  if (clamped) count = cap;
  const std::int64_t now = need.evaluate(b);
  if (now > count)
    throw policy_refusal("graphsafe: static-query-bound for request '" + std::string(request) + "' gives " +
                         std::to_string(count) + " but the request needs " + std::to_string(now) + " now (" +
                         need.to_string() + "); the bound " + bound_.to_string() +
                         " does not bound the need -- fix the bound or use capacity_bound");
  // Verified against the need at the current bindings; proven for every replay only when the
  // capacity bound fits too. Otherwise the guard checks each replay.
  SizingDecision d{count, capped && cap <= count, {}};
  if (capturing) d.note = static_note(bound_, b, clamped, cap);
  return d;
}

}  // namespace graphsafe
