#include <graphsafe/policies/exact_at_capture.hpp>

namespace graphsafe {

SizingDecision ExactAtCapture::size(std::string_view /*request*/, const Extent& need, const Bindings& b,
                                    bool capturing) const {
  SizingDecision d{need.evaluate(b), need.is_static(), {}};
  if (capturing) {  // the note names the values the size was frozen at
    const auto dyn = need.dynamic_symbols();
    d.note = "exact need " + need.to_string() + " = " + std::to_string(d.count);
    if (!dyn.empty()) {
      d.note += " at ";
      for (std::size_t i = 0; i < dyn.size(); ++i) d.note += (i ? ", " : "") + b.describe(dyn[i]);
    }
  }
  return d;
}

}  // namespace graphsafe
