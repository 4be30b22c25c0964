// The process-wide debug report: findings from the arena (capture, replay, canaries), probe,
// audit_replay and external detectors (CUPTI), printed as text and written as JSON.
#include <graphsafe/debug.hpp>
#include <graphsafe/error.hpp>

#include "environment.hpp"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <mutex>

namespace graphsafe {

namespace debug {

namespace {

class Report {
 public:
  ~Report() {
    // GRAPHSAFE_DEBUG_REPORT=path: write at exit. Never throw from a static destructor.
    try {
      const std::string path = detail::env::debug_report_path();
      if (path.empty()) return;
      std::ofstream f(path);
      if (f) f << json();
      if (!f) std::fprintf(stderr, "graphsafe: cannot write the debug report to %s\n", path.c_str());
    } catch (...) {
    }
  }

  void add(Finding f) {
    std::lock_guard g(m_);
    for (Finding& e : findings_) {
      if (e.kind == f.kind && e.request == f.request && e.graph == f.graph && e.site == f.site &&
          e.message == f.message) {
        e.count += f.count;
        return;
      }
    }
    findings_.push_back(std::move(f));
  }
  std::vector<Finding> snapshot() const {
    std::lock_guard g(m_);
    return findings_;
  }
  std::size_t size() const {
    std::lock_guard g(m_);
    return findings_.size();
  }
  void clear() {
    std::lock_guard g(m_);
    findings_.clear();
  }
  std::string json() const {
    const auto fs = snapshot();
    nlohmann::ordered_json findings = nlohmann::ordered_json::array();
    for (const Finding& f : fs)
      findings.push_back({{"kind", f.kind}, {"request", f.request}, {"graph", f.graph}, {"site", f.site},
                          {"message", f.message}, {"fix", f.fix}, {"count", f.count}});
    const nlohmann::ordered_json report = {
        {"graphsafe_debug_report", 1}, {"finding_count", fs.size()}, {"findings", std::move(findings)}};
    // Messages quote user strings (request and symbol names): invalid UTF-8 is replaced, not thrown.
    return report.dump(2, ' ', false, nlohmann::ordered_json::error_handler_t::replace) + "\n";
  }

 private:
  mutable std::mutex m_;
  std::vector<Finding> findings_;
};

Report& report() {
  static Report r;
  return r;
}

}  // namespace

bool env_enabled() noexcept {
  try {
    return detail::env::debug();
  } catch (...) {
    return false;  // no memory to read it: as if unset
  }
}

void report_finding(Finding f) { report().add(std::move(f)); }

void report_finding(std::string_view kind, std::string_view site, std::string_view message, std::string_view fix,
                    std::string_view request, std::string_view graph) {
  Finding f;
  f.kind = std::string(kind);
  f.site = std::string(site);
  f.message = std::string(message);
  f.fix = std::string(fix);
  f.request = std::string(request);
  f.graph = std::string(graph);
  report().add(std::move(f));
}

std::vector<Finding> findings() { return report().snapshot(); }
std::size_t finding_count() { return report().size(); }
void clear_findings() { report().clear(); }

std::string format_finding(const Finding& f) {
  std::string out = "  [" + f.kind + "]";
  if (!f.request.empty()) out += " '" + f.request + "'";
  if (!f.graph.empty()) out += " in " + f.graph;
  if (f.count > 1) out += " (x" + std::to_string(f.count) + ")";
  out += "\n";
  if (!f.site.empty()) out += "    at " + f.site + "\n";
  out += "    " + f.message + "\n";
  if (!f.fix.empty()) out += "    fix: " + f.fix + "\n";
  return out;
}

std::string report_text() {
  const auto fs = findings();
  std::string out = "graphsafe debug report: " + std::to_string(fs.size()) + " finding(s)\n";
  for (const Finding& f : fs) out += format_finding(f);
  return out;
}

std::string report_json() { return report().json(); }

void write_report(const std::string& path) {
  std::ofstream f(path);
  if (f) f << report_json();
  if (!f) throw error("graphsafe: cannot write the debug report to '" + path + "' (check the directory exists and is writable)");
}

}  // namespace debug
}  // namespace graphsafe
