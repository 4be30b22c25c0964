// The one place a replay is refused (guard_failure): plan guards (Plan::enforce) and virtual
// growth's footprint and batch checks all throw through it, so every refusal reads alike
// ("graphsafe: replay refused before launch: <why>") and carries its violations.
#pragma once

#include <graphsafe/error.hpp>

#include <string>
#include <vector>

namespace graphsafe::detail {

[[noreturn]] void refuse_replay(const std::string& why, std::vector<GuardViolation> violations);

}  // namespace graphsafe::detail
