// Sizing policies: how many elements to reserve for a request whose need is an Extent.
//
// One small interface so an engine can add its own. A policy sees the request's name, its need and
// the bindings at the time of the request (capture time for captured requests) and returns the
// element count to reserve, or throws policy_refusal with a message that names the symbol and the
// fix. It also says whether the count is replay-safe: whether every binding the graph may be
// replayed with (within capacities) needs no more. Unsafe sizes are allowed (that is the point of
// exact_at_capture: the reference of what goes wrong) but are reported at capture and checked by a
// guard before every replay.
#pragma once

#include <graphsafe/bindings.hpp>
#include <graphsafe/extent.hpp>

#include <cstdint>
#include <string>
#include <string_view>

namespace graphsafe {

struct SizingDecision {
  std::int64_t count = 0;    // elements to reserve
  bool replay_safe = false;  // true: no binding within capacities needs more (guard is implied)
  std::string note;          // why, for plans and reports (written only when capturing)
};

class SizingPolicy {
 public:
  virtual ~SizingPolicy() = default;
  virtual std::string_view name() const = 0;
  // `capturing` is true when the request is recorded into a graph.
  virtual SizingDecision size(std::string_view request, const Extent& need, const Bindings& b,
                              bool capturing) const = 0;
};

}  // namespace graphsafe
