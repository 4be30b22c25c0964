#include <graphsafe/error.hpp>
#include <graphsafe/policies/capacity_bound.hpp>

namespace graphsafe {

SizingDecision CapacityBound::size(std::string_view request, const Extent& need, const Bindings& b,
                                   bool capturing) const {
  try {
    SizingDecision d{need.capacity_bound(b), true, {}};
    if (capturing) {  // notes are for plans and reports; eager requests skip the string work
      d.note = "capacity bound of " + need.to_string();
      for (Symbol s : need.dynamic_symbols())
        if (s.capacity()) d.note += "; " + s.name() + " <= " + std::to_string(*s.capacity());
    }
    return d;
  } catch (const policy_refusal& e) {
    throw policy_refusal("graphsafe: capacity-bound cannot size request '" + std::string(request) + "': " +
                         std::string(e.what()).substr(std::string("graphsafe: ").size()));
  }
}

}  // namespace graphsafe
