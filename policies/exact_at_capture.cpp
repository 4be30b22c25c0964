#include <graphsafe/policies/exact_at_capture.hpp>

namespace graphsafe {

SizingDecision ExactAtCapture::size(std::string_view /*request*/, const Extent& need, const Bindings& b,
                                    bool /*capturing*/) const {
  const std::int64_t count = need.evaluate(b);
  const auto dyn = need.dynamic_symbols();
  std::string note = "exact need " + need.to_string() + " = " + std::to_string(count);
  if (!dyn.empty()) {
    note += " at ";
    for (std::size_t i = 0; i < dyn.size(); ++i) note += (i ? ", " : "") + b.describe(dyn[i]);
  }
  return {count, dyn.empty(), std::move(note)};
}

}  // namespace graphsafe
