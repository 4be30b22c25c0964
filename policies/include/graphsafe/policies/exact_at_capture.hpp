// exact_at_capture: reserve exactly the need under the current bindings -- what engines did before
// graphsafe. Correct eagerly (sizes are recomputed every step); under capture it freezes a size
// computed from values that change between replays. It is kept as the reference of what goes wrong:
// such a request is reported at capture time (replay_safe = false) and its guard refuses any replay
// that needs more.
#pragma once

#include <graphsafe/sizing_policy.hpp>

namespace graphsafe {

class ExactAtCapture final : public SizingPolicy {
 public:
  std::string_view name() const override { return "exact-at-capture"; }
  SizingDecision size(std::string_view request, const Extent& need, const Bindings& b,
                      bool capturing) const override;
};

inline const ExactAtCapture exact_at_capture{};

}  // namespace graphsafe
