#include <graphsafe/error.hpp>
#include <graphsafe/policies/capacity_bound.hpp>

namespace graphsafe {

namespace {
// Notes are for plans and reports: built only when capturing, out of the eager path's frame.
[[gnu::noinline, gnu::cold]] std::string capacity_note(const Extent& need) {
  std::string note = "capacity bound of ";
  note += need.to_string();
  for (Symbol s : need.dynamic_symbols())
    if (const auto cap = s.capacity()) {
      note += "; ";
      note += s.name();
      note += " <= ";
      note += std::to_string(*cap);
    }
  return note;
}
// The refusal names the request; out of line so the eager path's frame stays small.
[[noreturn, gnu::noinline, gnu::cold]] void refuse(std::string_view request, const policy_refusal& e) {
  throw policy_refusal("graphsafe: capacity-bound cannot size request '" + std::string(request) + "': " +
                       std::string(e.what()).substr(std::string("graphsafe: ").size()));
}
}  // namespace

SizingDecision CapacityBound::size(std::string_view request, const Extent& need, const Bindings& b,
                                   bool capturing) const {
  std::int64_t count = 0;
  try {
    count = need.capacity_bound(b);
  } catch (const policy_refusal& e) {
    refuse(request, e);
  }
  // Built in the caller's slot (no try around it, so no copy of the decision and its string).
  SizingDecision d{count, true, {}};
  if (capturing) d.note = capacity_note(need);
  return d;
}

}  // namespace graphsafe
