#include <graphsafe/error.hpp>
#include <graphsafe/policies/capacity_bound.hpp>

namespace graphsafe {

SizingDecision CapacityBound::size(std::string_view request, const Extent& need, const Bindings& b,
                                   bool /*capturing*/) const {
  try {
    const std::int64_t count = need.capacity_bound(b);
    std::string note = "capacity bound of " + need.to_string();
    for (Symbol s : need.dynamic_symbols())
      if (s.capacity()) note += "; " + s.name() + " <= " + std::to_string(*s.capacity());
    return {count, true, std::move(note)};
  } catch (const policy_refusal& e) {
    throw policy_refusal("graphsafe: capacity-bound cannot size request '" + std::string(request) + "': " +
                         std::string(e.what()).substr(std::string("graphsafe: ").size()));
  }
}

}  // namespace graphsafe
