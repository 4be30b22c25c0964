#include <graphsafe/policies/exact_at_capture.hpp>

namespace graphsafe {

namespace {
// The note names the values the size was frozen at; built only when capturing, out of the eager
// path's frame.
[[gnu::noinline, gnu::cold]] std::string exact_note(const Extent& need, const Bindings& b, std::int64_t count) {
  const auto dyn = need.dynamic_symbols();
  std::string note = "exact need " + need.to_string() + " = " + std::to_string(count);
  if (!dyn.empty()) {
    note += " at ";
    for (std::size_t i = 0; i < dyn.size(); ++i) note += (i ? ", " : "") + b.describe(dyn[i]);
  }
  return note;
}
}  // namespace

SizingDecision ExactAtCapture::size(std::string_view /*request*/, const Extent& need, const Bindings& b,
                                    bool capturing) const {
  SizingDecision d{need.evaluate(b), need.is_static(), {}};
  if (capturing) d.note = exact_note(need, b, d.count);
  return d;
}

}  // namespace graphsafe
