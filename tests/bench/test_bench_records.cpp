// The benchmarks' record writer (bench/bench_support.hpp): what bench/results/ and the plots read.
#include <catch2/catch.hpp>

#include "../../bench/bench_support.hpp"

#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>

namespace bench = graphsafe::bench;

namespace {
std::string slurp(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}
std::string temp_path(const char* name) {
  return (std::filesystem::temp_directory_path() / name).string();
}
}  // namespace

TEST_CASE("benchmark records are written in the results format, one per line", "[bench]") {
  const std::string path = temp_path("graphsafe_test_bench_records.json");
  const std::vector<bench::Record> recs = {
      {"pair.arena", 26.4912345, "ns", "pair.cuda", 702.566},         // ratio = 702.566 / 26.4912345
      {"pair.cuda", 702.566, "ns", "", 0},                              // no baseline
      {"attention_us", 23.9085, "us", "bound_us", 8.04351, 2.97239},  // ratio given
      {"quote \"and\"\nnewline", std::numeric_limits<double>::quiet_NaN(), "B", "", 0},
  };
  bench::write_records(path, recs, "NVIDIA H200, 132 SMs", "build/bench/x --json out.json");
  const std::string text = slurp(path);
  std::remove(path.c_str());

  const auto j = nlohmann::json::parse(text);
  REQUIRE(j.is_array());
  REQUIRE(j.size() == 4);
  // 6 significant digits: 26.4912345 -> 26.4912; the ratio 702.566 / 26.4912345 = 26.52072... -> 26.5207
  CHECK(j[0]["value"] == 26.4912);
  CHECK(j[0]["baseline_name"] == "pair.cuda");
  CHECK(j[0]["baseline_value"] == 702.566);
  CHECK(j[0]["ratio"] == 26.5207);
  CHECK(j[1]["baseline_name"].is_null());
  CHECK(j[1]["baseline_value"].is_null());
  CHECK(j[1]["ratio"].is_null());
  CHECK(j[2]["ratio"] == 2.97239);
  CHECK(j[3]["name"] == "quote \"and\"\nnewline");
  CHECK(j[3]["value"].is_null());  // NaN is not JSON
  for (const auto& r : j) {
    CHECK(r["machine"] == "NVIDIA H200, 132 SMs");
    CHECK(r["command"] == "build/bench/x --json out.json");
  }
  // The fields in the documented order, each record on its own line between "[" and "]".
  std::istringstream lines(text);
  std::string line;
  std::getline(lines, line);
  CHECK(line == "[");
  std::getline(lines, line);
  const auto at = [&](const char* key) { return line.find(std::string("\"") + key + "\""); };
  CHECK(at("name") < at("value"));
  CHECK(at("value") < at("unit"));
  CHECK(at("unit") < at("baseline_name"));
  CHECK(at("baseline_name") < at("baseline_value"));
  CHECK(at("baseline_value") < at("ratio"));
  CHECK(at("ratio") < at("machine"));
  CHECK(at("machine") < at("command"));
}

TEST_CASE("an unwritable results path is reported before the run and a writable one is left untouched",
          "[bench]") {
  CHECK_THROWS_WITH(bench::check_writable("/nonexistent-dir/out.json"),
                    Catch::Contains("/nonexistent-dir/out.json") && Catch::Contains("No such file"));
  const std::string fresh = temp_path("graphsafe_test_bench_fresh.json");
  std::filesystem::remove(fresh);
  bench::check_writable(fresh);
  CHECK_FALSE(std::filesystem::exists(fresh));
  const std::string kept = temp_path("graphsafe_test_bench_kept.json");
  std::ofstream(kept) << "[]\n";
  bench::check_writable(kept);
  CHECK(slurp(kept) == "[]\n");
  std::filesystem::remove(kept);
  CHECK_THROWS_WITH(bench::write_records("/nonexistent-dir/out.json", {}, "m", "c"),
                    Catch::Contains("/nonexistent-dir/out.json"));
}

TEST_CASE("a number read back from another tool's JSON, and what is refused naming the file", "[bench]") {
  const std::string path = temp_path("graphsafe_test_bench_read.json");
  std::ofstream(path) << R"({"device": "H200", "reserved_bytes": 1.5e9, "note": "x"})";
  CHECK(bench::read_json_number(path, "reserved_bytes") == 1.5e9);
  CHECK_THROWS_WITH(bench::read_json_number(path, "peak_bytes"),
                    Catch::Contains(path) && Catch::Contains("no number at \"peak_bytes\""));
  CHECK_THROWS_WITH(bench::read_json_number(path, "device"), Catch::Contains("no number at \"device\""));
  std::ofstream(path) << R"({"reserved_bytes": 12)";  // cut short
  CHECK_THROWS_WITH(bench::read_json_number(path, "reserved_bytes"), Catch::Contains(path + " is not JSON"));
  std::ofstream(path) << "[1, 2]";
  CHECK_THROWS_WITH(bench::read_json_number(path, "reserved_bytes"), Catch::Contains("no number"));
  std::filesystem::remove(path);
  CHECK_THROWS_WITH(bench::read_json_number(path, "reserved_bytes"),
                    Catch::Contains("cannot read " + path) && Catch::Contains("No such file"));
}
