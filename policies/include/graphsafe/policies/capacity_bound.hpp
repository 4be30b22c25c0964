// capacity_bound: reserve the need with every dynamic symbol replaced by its declared capacity
// (e.g. seq_len -> max_model_len). Always replay-safe; refuses a dynamic symbol with no capacity.
#pragma once

#include <graphsafe/sizing_policy.hpp>

namespace graphsafe {

class CapacityBound final : public SizingPolicy {
 public:
  std::string_view name() const override { return "capacity-bound"; }
  SizingDecision size(std::string_view request, const Extent& need, const Bindings& b,
                      bool capturing) const override;
};

inline const CapacityBound capacity_bound{};

}  // namespace graphsafe
