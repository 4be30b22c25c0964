// guard_refusal: the seed scenario end to end, as a program.
//
// A decode step gathers a DS4-style workspace: per request, a compressed part of N rows followed by
// an SWA part of G rows at offset N (row stride M = N + G). N and G are sized at capture time by the
// policy chosen with --policy; the graph is then replayed while the sequences grow
// ([3,5] -> [15,17] -> [255,257]):
//
//   --policy capacity       N and G bounded by capacities (seq_lens <= 512): every replay is checked
//                           against an eager recomputation and reported OK.
//   --policy static-query   N by capacity, G by the static query bound (G <= window): same.
//   --policy exact          sizes frozen from the capture-time lengths (what engines did): the capture
//                           finding is printed, then the guard refusing the replay that needs more.
//   --recapture             with a recapture hook, a refused replay re-captures at the next bucket
//                           (lengths rounded up to a multiple of 64) and runs; checked like the others.
//   --host                  use the host backend even when a CUDA device is present.
//
// With a CUDA device the graph is a real CUDA Graph on a real stream (guard_refusal_kernels.cu);
// without one, the host backend runs the same logic on the CPU. The first line says which.
// Exit code: 0 when every check passed, 1 when one failed, 2 on bad usage.
#include "guard_refusal_kernels.hpp"

#include <graphsafe/graphsafe.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <memory>
#include <optional>
#include <span>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

using namespace graphsafe;
using guard_refusal::cmp_value;
using guard_refusal::swa_value;

namespace {

constexpr int kWindow = 4;    // W
constexpr int kRatio = 4;     // compression ratio (C4)
constexpr int kMaxLen = 512;  // max_model_len: the capacity of seq_lens
constexpr int kRequests = 2;
constexpr int kOutStride = kMaxLen / kRatio + kWindow;  // most rows one request reads
constexpr int kBucket = 64;

using Rows = std::vector<std::vector<std::int64_t>>;

// What an eager (uncaptured) step computes for these lengths: the reference of every replay.
Rows eager(const std::vector<int>& lens) {
  Rows e(lens.size());
  for (std::size_t b = 0; b < lens.size(); ++b) {
    const int L = lens[b], n_c = L / kRatio, g = std::min(L, kWindow);
    for (int c = 0; c < n_c; ++c) e[b].push_back(cmp_value(static_cast<int>(b), c));
    for (int i = 0; i < g; ++i) e[b].push_back(swa_value(static_cast<int>(b), L - g + i));
  }
  return e;
}

std::string show(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (std::size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << "]";
  return os.str();
}

// Where the step runs: the "device" holding the lengths buffer and the output, and the stream.
class Device {
 public:
  virtual ~Device() = default;
  virtual Backend& backend() = 0;
  virtual Stream stream() = 0;
  // Stream-ordered update of the device lengths buffer (before a replay, outside capture).
  virtual void set_lens(const std::vector<int>& lens) = 0;
  // Clear the output, so a replay that never launched leaves it empty.
  virtual void clear_out() = 0;
  // Enqueue the step (recorded when capturing) with N and M frozen.
  virtual void decode_step(std::int64_t* ws, std::int64_t N, std::int64_t M) = 0;
  // Wait for the stream and read the output back.
  virtual Rows read_out() = 0;
};

class HostDevice final : public Device {
 public:
  Backend& backend() override { return backend_; }
  Stream stream() override { return stream_; }
  void set_lens(const std::vector<int>& lens) override { lens_ = lens; }
  void clear_out() override { out_.assign(kRequests, {}); }
  void decode_step(std::int64_t* ws, std::int64_t N, std::int64_t M) override {
    // Closures copy ws, N and M (frozen like kernel arguments) and read the lengths at run time.
    stream_.launch([this, ws, N, M] {
      for (int b = 0; b < static_cast<int>(lens_.size()); ++b) {
        const int L = lens_[b], n_c = L / kRatio, g = std::min(L, kWindow);
        for (int c = 0; c < n_c; ++c) ws[b * M + c] = cmp_value(b, c);
        for (int i = 0; i < g; ++i) ws[b * M + N + i] = swa_value(b, L - g + i);
      }
    });
    stream_.launch([this, ws, N, M] {
      for (int b = 0; b < static_cast<int>(lens_.size()); ++b) {
        const int L = lens_[b], n_c = L / kRatio, g = std::min(L, kWindow);
        out_[b].clear();
        for (int c = 0; c < n_c; ++c) out_[b].push_back(ws[b * M + c]);
        for (int i = 0; i < g; ++i) out_[b].push_back(ws[b * M + N + i]);
      }
    });
  }
  Rows read_out() override { return out_; }

 private:
  HostBackend backend_;
  HostStream stream_;
  std::vector<int> lens_ = std::vector<int>(kRequests, 0);
  Rows out_ = Rows(kRequests);
};

class CudaDevice final : public Device {
 public:
  CudaDevice() {
    GRAPHSAFE_CUDA(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    GRAPHSAFE_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_lens_), sizeof(int) * kRequests));
    GRAPHSAFE_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_out_), sizeof(std::int64_t) * kRequests * kOutStride));
    GRAPHSAFE_CUDA(cudaMalloc(reinterpret_cast<void**>(&d_out_len_), sizeof(int) * kRequests));
    backend_ = std::make_unique<CudaBackend>();
  }
  ~CudaDevice() override {
    cudaStreamSynchronize(stream_);
    cudaFree(d_out_len_);
    cudaFree(d_out_);
    cudaFree(d_lens_);
    cudaStreamDestroy(stream_);
  }
  Backend& backend() override { return *backend_; }
  Stream stream() override { return stream_; }
  void set_lens(const std::vector<int>& lens) override {
    lens_ = lens;  // the copy reads lens_ when the stream gets to it: keep it alive
    GRAPHSAFE_CUDA(cudaMemcpyAsync(d_lens_, lens_.data(), sizeof(int) * lens_.size(), cudaMemcpyHostToDevice, stream_));
    GRAPHSAFE_CUDA(cudaStreamSynchronize(stream_));
  }
  void clear_out() override {
    GRAPHSAFE_CUDA(cudaMemsetAsync(d_out_len_, 0, sizeof(int) * kRequests, stream_));
  }
  void decode_step(std::int64_t* ws, std::int64_t N, std::int64_t M) override {
    GRAPHSAFE_CUDA(guard_refusal::launch_decode_step(stream_, ws, N, M, d_lens_, kRequests, kRatio, kWindow, d_out_,
                                                     d_out_len_, kOutStride));
  }
  Rows read_out() override {
    std::vector<std::int64_t> out(static_cast<std::size_t>(kRequests) * kOutStride);
    std::vector<int> len(kRequests);
    GRAPHSAFE_CUDA(cudaMemcpyAsync(out.data(), d_out_, sizeof(std::int64_t) * out.size(), cudaMemcpyDeviceToHost,
                                   stream_));
    GRAPHSAFE_CUDA(cudaMemcpyAsync(len.data(), d_out_len_, sizeof(int) * len.size(), cudaMemcpyDeviceToHost, stream_));
    GRAPHSAFE_CUDA(cudaStreamSynchronize(stream_));
    Rows r(kRequests);
    for (int b = 0; b < kRequests; ++b) r[b].assign(out.begin() + b * kOutStride, out.begin() + b * kOutStride + len[b]);
    return r;
  }

 private:
  cudaStream_t stream_ = nullptr;
  int* d_lens_ = nullptr;
  std::int64_t* d_out_ = nullptr;
  int* d_out_len_ = nullptr;
  std::vector<int> lens_;
  std::unique_ptr<CudaBackend> backend_;
};

struct Options {
  std::string policy = "exact";
  bool recapture = false;
  bool force_host = false;
};

void usage(std::FILE* f) {
  std::fprintf(f,
               "usage: guard_refusal [--policy capacity|static-query|exact] [--recapture] [--host]\n"
               "  Captures a decode step whose workspace is sized by the policy, replays it while the\n"
               "  sequences grow [3,5] -> [15,17] -> [255,257] and checks every replay against eager.\n"
               "  default: --policy exact\n");
}

std::optional<Options> parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view a = argv[i];
    if (a == "--policy" && i + 1 < argc) {
      o.policy = argv[++i];
    } else if (a.starts_with("--policy=")) {
      o.policy = std::string(a.substr(9));
    } else if (a == "--recapture") {
      o.recapture = true;
    } else if (a == "--host") {
      o.force_host = true;
    } else if (a == "-h" || a == "--help") {
      usage(stdout);
      std::exit(0);
    } else {
      std::fprintf(stderr, "guard_refusal: unknown argument '%s'\n", argv[i]);
      return std::nullopt;
    }
  }
  if (o.policy != "capacity" && o.policy != "static-query" && o.policy != "exact") {
    std::fprintf(stderr, "guard_refusal: unknown policy '%s'\n", o.policy.c_str());
    return std::nullopt;
  }
  return o;
}

int run(const Options& opt, Device& dev) {
  int failures = 0;
  const Symbol R = Symbol::fixed("requests");
  const Symbol W = Symbol::fixed("window");
  const Symbol L = Symbol::batch("seq_lens", R, kMaxLen);
  const Extent n_c = max_over(L, [](const Extent& l) { return floor_div(l, kRatio); });  // N
  const Extent g = max_over(L, [&](const Extent& l) { return min(l, Extent(W)); });     // G

  const StaticQueryBound swa_bound{Extent(W)};  // one query token per request: G <= W
  const SizingPolicy* compressed = &capacity_bound;
  const SizingPolicy* swa = &capacity_bound;
  if (opt.policy == "static-query") swa = &swa_bound;
  if (opt.policy == "exact") compressed = swa = &exact_at_capture;
  const bool safe_policy = opt.policy != "exact";

  ArenaOptions options;
  options.report_findings = false;  // findings printed below
  Arena arena(dev.backend(), options);
  const Stream s = dev.stream();
  arena.reserve(1 << 20, s);

  std::vector<int> capture_lens = {3, 5};
  Bindings b;
  b.set(R, kRequests).set(W, kWindow).set(L, {capture_lens[0], capture_lens[1]});
  dev.set_lens(capture_lens);

  CaptureOptions copts;
  if (opt.recapture) {
    copts.recapture = [&](const Bindings& refused) -> std::optional<Bindings> {
      std::vector<std::int64_t> up;
      for (auto v : refused.values(L)) up.push_back(std::min<std::int64_t>((v + kBucket - 1) / kBucket * kBucket, kMaxLen));
      Bindings bucket = refused;
      bucket.set(L, std::span<const std::int64_t>(up));
      std::printf("\n  recapture hook: guard refused %s -> re-capturing at the next bucket, %s\n",
                  refused.describe(L).c_str(), bucket.describe(L).c_str());
      return bucket;
    };
  }

  std::printf("policy: %s (compressed rows: %s, SWA rows: %s, workspace: %s)%s\n", opt.policy.c_str(),
              std::string(compressed->name()).c_str(), std::string(swa->name()).c_str(),
              std::string(opt.policy == "exact" ? exact_at_capture.name() : capacity_bound.name()).c_str(),
              opt.recapture ? ", recapture hook on" : "");
  const SizingPolicy& ws_policy = opt.policy == "exact" ? static_cast<const SizingPolicy&>(exact_at_capture)
                                                        : static_cast<const SizingPolicy&>(capacity_bound);
  std::printf("capture at %s\n", b.describe(L).c_str());
  auto graph = capture(
      arena, s, b,
      [&](const Bindings& bb) {
        const std::int64_t N = arena.dimension(s, "kv.compressed_rows", n_c, *compressed, bb);
        const std::int64_t G = arena.dimension(s, "kv.swa_rows", g, *swa, bb);
        const std::int64_t M = N + G;  // row stride: the SWA part sits at offset N
        auto ws = arena.request(s, "kv", Extent(R) * M, sizeof(std::int64_t), ws_policy, bb);
        std::printf("  captured: N = %lld compressed rows, G = %lld SWA rows, M = %lld, workspace %lld rows "
                    "(%llu bytes)\n",
                    static_cast<long long>(N), static_cast<long long>(G), static_cast<long long>(M),
                    static_cast<long long>(ws.count()), static_cast<unsigned long long>(ws.bytes()));
        dev.decode_step(ws.as<std::int64_t>(), N, M);
      },
      copts);
  {  // the plan, without its findings (listed below)
    std::istringstream report(graph.plan().report());
    for (std::string line; std::getline(report, line);)
      if (!line.starts_with("  finding:")) std::printf("%s\n", line.c_str());
  }

  // Detection at capture time.
  const auto& findings = graph.plan().findings();
  if (findings.empty()) {
    std::printf("capture findings: none (every size is replay-safe; %zu guards to check)\n", graph.plan().guard_count());
  } else {
    std::printf("capture findings: %zu\n", findings.size());
    for (const auto& f : findings) std::printf("  FINDING %s at %s:\n    %s\n", f.request.c_str(), f.site.c_str(), f.message.c_str());
  }
  if (safe_policy && (!findings.empty() || graph.plan().guard_count() != 0)) {
    std::printf("  CHECK FAILED: a safe policy should leave no finding and no guard\n");
    ++failures;
  }
  if (!safe_policy && findings.empty()) {
    std::printf("  CHECK FAILED: exact-at-capture on seq_lens should be reported at capture\n");
    ++failures;
  }

  // Replays while the sequences grow.
  for (const std::vector<int>& lens : {std::vector<int>{3, 5}, {15, 17}, {255, 257}}) {
    dev.set_lens(lens);
    b.set(L, {lens[0], lens[1]});
    dev.clear_out();
    std::printf("replay at seq_lens = %s: ", show(lens).c_str());
    const bool fits_capture = lens == capture_lens;
    const bool must_refuse = !safe_policy && !opt.recapture && !fits_capture;
    const auto recaptures_before = graph.recaptures();
    bool refused = false;
    try {
      std::fflush(stdout);
      graph.replay(b, s);
    } catch (const guard_failure& e) {
      refused = true;
      std::printf("REFUSED by the guard (never launched):\n    %s\n", e.what());
    }
    if (refused) {
      const Rows out = dev.read_out();
      bool untouched = true;
      for (const auto& r : out) untouched &= r.empty();
      if (!must_refuse) {
        std::printf("  CHECK FAILED: this replay should not have been refused\n");
        ++failures;
      } else if (!untouched) {
        std::printf("  CHECK FAILED: a refused replay wrote output\n");
        ++failures;
      } else {
        std::printf("  expected: exact-at-capture froze N and G from %s; the output is untouched\n",
                    show(capture_lens).c_str());
      }
      continue;
    }
    if (graph.recaptures() != recaptures_before) std::printf("  re-captured (%llu so far), ", static_cast<unsigned long long>(graph.recaptures()));
    if (must_refuse) {
      std::printf("CHECK FAILED: ran, but the guard should have refused it\n");
      ++failures;
      continue;
    }
    const Rows out = dev.read_out();
    const Rows want = eager(lens);
    if (out == want) {
      std::size_t rows = 0;
      for (const auto& r : out) rows += r.size();
      std::printf("OK (%zu rows, equal to eager recomputation)\n", rows);
    } else {
      std::printf("CHECK FAILED: replay differs from eager recomputation\n");
      ++failures;
    }
  }
  if (opt.recapture) std::printf("recaptures: %llu\n", static_cast<unsigned long long>(graph.recaptures()));
  return failures;
}

}  // namespace

int main(int argc, char** argv) {
  const auto opt = parse(argc, argv);
  if (!opt) {
    usage(stderr);
    return 2;
  }
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  const bool have_gpu = err == cudaSuccess && count > 0;
  std::unique_ptr<Device> dev;
  try {
    if (have_gpu && !opt->force_host) {
      cudaDeviceProp prop{};
      int id = 0;
      GRAPHSAFE_CUDA(cudaGetDevice(&id));
      GRAPHSAFE_CUDA(cudaGetDeviceProperties(&prop, id));
      std::printf("graphsafe guard_refusal: CUDA device %d (%s, sm_%d%d) -- running on the CUDA backend "
                  "(real stream, CUDA Graph)\n",
                  id, prop.name, prop.major, prop.minor);
      dev = std::make_unique<CudaDevice>();
    } else if (have_gpu) {
      std::printf("graphsafe guard_refusal: --host given (%d CUDA device(s) present) -- running on the host "
                  "backend (CPU reference path)\n",
                  count);
      dev = std::make_unique<HostDevice>();
    } else {
      std::printf("graphsafe guard_refusal: no CUDA device (cudaGetDeviceCount: %s, count=%d) -- running on the "
                  "host backend (CPU reference path)\n",
                  err == cudaSuccess ? "no error" : cudaGetErrorString(err), count);
      dev = std::make_unique<HostDevice>();
    }
    const int failures = run(*opt, *dev);
    dev.reset();
    std::printf("%s\n", failures == 0 ? "result: all checks passed" : "result: CHECKS FAILED");
    return failures == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::printf("guard_refusal: unexpected error: %s\n", e.what());
    return 1;
  }
}
