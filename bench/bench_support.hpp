// What every benchmark shares: the record format of bench/results/ and its JSON writer.
//
//   std::vector<graphsafe::bench::Record> recs;
//   recs.push_back({"eager_pair.arena_request_release", 26.5, "ns", "eager_pair.cudaMallocAsync", 703.0});
//   graphsafe::bench::write_records("out.json", recs, "NVIDIA H200", graphsafe::bench::command_line(argc, argv));
//
// Compiled by the host compiler (bench_support.cpp), so the CUDA sources never parse nlohmann-json.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace graphsafe::bench {

// One figure. Without a baseline (empty baseline_name) the JSON has null baseline_value and ratio;
// with one, ratio is `ratio` when given, else baseline_value / value (how many times cheaper).
struct Record {
  std::string name;
  double value = 0;
  std::string unit;
  std::string baseline_name;
  double baseline_value = 0;
  std::optional<double> ratio;
};

// argv joined by spaces: the record's "command".
std::string command_line(int argc, char** argv);

// Writes `records` as a JSON array of {name, value, unit, baseline_name, baseline_value, ratio,
// machine, command}; numbers keep 6 significant digits, non-finite ones become null. Throws
// std::runtime_error naming the path when it cannot be written.
void write_records(const std::string& path, const std::vector<Record>& records, const std::string& machine,
                   const std::string& command);

// Parses argv into `app` and checks that `json_path` (when given) can be written. Returns the exit
// code to leave with (0 after --help; 2 after a one-line error on stderr naming the program), or
// nullopt to go on.
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv, const std::string& json_path);

// The number at `key` of the JSON object in the file at `path` (another tool's output read back,
// e.g. bench/torch_capture_pool.py's). Throws std::runtime_error naming the path (and the key) when
// the file cannot be read, is not JSON, or has no number there.
double read_json_number(const std::string& path, const std::string& key);

// Throws std::runtime_error naming the path unless it can be written (checked before a long run;
// an existing file is left as it is).
void check_writable(const std::string& path);

}  // namespace graphsafe::bench
