#include "environment.hpp"

#include <cctype>
#include <cstdlib>

namespace graphsafe::detail::env {

namespace {
std::string read(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::string(v) : std::string();
}
}  // namespace

bool debug() {
  std::string s = read("GRAPHSAFE_DEBUG");
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return !(s.empty() || s == "0" || s == "false" || s == "off" || s == "no");
}

bool plain_allocations() { return read("GRAPHSAFE_DEBUG").starts_with('1'); }

std::string debug_report_path() { return read("GRAPHSAFE_DEBUG_REPORT"); }

std::string host_execution() { return read("GRAPHSAFE_HOST_EXECUTION"); }

}  // namespace graphsafe::detail::env
