// Private helpers of the DS4 CPU reference (not installed, not part of the API).
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace graphsafe::ds4::ref::detail {

// Throws std::invalid_argument("graphsafe::ds4: " + the streamed arguments).
template <class... Args>
[[noreturn]] void fail(Args&&... args) {
  std::ostringstream os;
  os << "graphsafe::ds4: ";
  (os << ... << std::forward<Args>(args));
  throw std::invalid_argument(os.str());
}

inline long long ceil_div(long long a, long long b) { return (a + b - 1) / b; }
inline long long round_up(long long a, long long b) { return ceil_div(a, b) * b; }

}  // namespace graphsafe::ds4::ref::detail
