// A main for the fuzz harness without libFuzzer: runs each input file (or every file of each
// directory) given on the command line once, as `arena_fuzzer -runs=0 <corpus>` does. Lets any
// compiler replay the corpus (CTest: arena_fuzzer_replay*).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size);

int main(int argc, char** argv) {
  namespace fs = std::filesystem;
  std::size_t inputs = 0;
  for (int i = 1; i < argc; ++i) {
    std::vector<fs::path> files;
    if (fs::is_directory(argv[i])) {
      for (const auto& e : fs::directory_iterator(argv[i]))
        if (e.is_regular_file()) files.push_back(e.path());
    } else {
      files.emplace_back(argv[i]);
    }
    for (const fs::path& f : files) {
      std::ifstream in(f, std::ios::binary);
      if (!in) {
        std::fprintf(stderr, "arena_fuzzer_replay: cannot read %s\n", f.c_str());
        return 1;
      }
      const std::vector<char> bytes{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
      LLVMFuzzerTestOneInput(reinterpret_cast<const std::uint8_t*>(bytes.data()), bytes.size());
      ++inputs;
    }
  }
  std::printf("arena_fuzzer_replay: %zu inputs ran\n", inputs);
  if (inputs == 0) {
    std::fprintf(stderr, "arena_fuzzer_replay: no inputs (pass corpus files or directories)\n");
    return 1;
  }
  return 0;
}
