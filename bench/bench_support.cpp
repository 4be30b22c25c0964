#include "bench_support.hpp"

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace graphsafe::bench {

namespace {
nlohmann::ordered_json number(double v) {
  if (!std::isfinite(v)) return nullptr;
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return std::strtod(buf, nullptr);
}
}  // namespace

std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, const std::string& json_path) {
  const std::string name = app.get_name();
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: %s (--help lists the options)\n", name.c_str(), e.what());
    return 2;
  }
  // Checked after parsing: json_path is bound to the --json option.
  try {
    if (!json_path.empty()) check_writable(json_path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: --json: %s\n", name.c_str(), e.what());
    return 2;
  }
  return std::nullopt;
}

std::string command_line(int argc, char** argv) {
  std::string c;
  for (int i = 0; i < argc; ++i) c += (i ? " " : "") + std::string(argv[i]);
  return c;
}

void write_records(const std::string& path, const std::vector<Record>& records, const std::string& machine,
                   const std::string& command) {
  nlohmann::ordered_json out = nlohmann::ordered_json::array();
  for (const Record& r : records) {
    const bool base = !r.baseline_name.empty();
    nlohmann::ordered_json j;
    j["name"] = r.name;
    j["value"] = number(r.value);
    j["unit"] = r.unit;
    j["baseline_name"] = base ? nlohmann::ordered_json(r.baseline_name) : nullptr;
    j["baseline_value"] = base ? number(r.baseline_value) : nullptr;
    j["ratio"] = !base ? nullptr : r.ratio ? number(*r.ratio) : number(r.baseline_value / r.value);
    j["machine"] = machine;
    j["command"] = command;
    out.push_back(std::move(j));
  }
  std::ofstream f(path);
  if (!f) throw std::runtime_error("cannot write " + path + " (" + std::strerror(errno) + ")");
  // One record per line, as in bench/results/.
  f << "[\n";
  for (std::size_t i = 0; i < out.size(); ++i)
    f << "  " << out[i].dump(-1, ' ', false, nlohmann::ordered_json::error_handler_t::replace)
      << (i + 1 < out.size() ? ",\n" : "\n");
  f << "]\n";
  if (!f) throw std::runtime_error("error writing " + path);
}

double read_json_number(const std::string& path, const std::string& key) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot read " + path + " (" + std::strerror(errno) + ")");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(f);
  } catch (const nlohmann::json::parse_error& e) {
    throw std::runtime_error(path + " is not JSON: " + e.what());
  }
  if (!j.is_object() || !j.contains(key) || !j[key].is_number())
    throw std::runtime_error(path + " has no number at \"" + key + "\"");
  return j[key].get<double>();
}

void check_writable(const std::string& path) {
  const bool existed = std::filesystem::exists(path);
  std::ofstream probe(path, std::ios::app);
  if (!probe) throw std::runtime_error("cannot write " + path + " (" + std::strerror(errno) + ")");
  probe.close();
  if (!existed) std::filesystem::remove(path);
}

}  // namespace graphsafe::bench
