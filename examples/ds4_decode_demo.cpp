// ds4_decode_demo: an attention-only DeepSeek V4 ("DS4") decode loop on graphsafe -- the README's
// main command.
//
// A V4-Flash-like layer schedule (layers 0 and 1 SWA-only, then C4 and C128 alternating; 43 layers by
// default) runs one of two decode paths (--path), every workspace and every row count sized through
// graphsafe:
//   --path paged   (default) the paged-direct path: on C4 layers the lightning indexer
//                  (graphsafe::ds4::IndexerDecode: scores on fp8 tensor cores, top-k) picks the
//                  compressed rows and writes them as the attention's paged index lists, then
//                  graphsafe::ds4::PagedDecode attends straight from the fp8 caches. The indexer's
//                  logits row stride N is the size a graph freezes.
//   --path gather  the gather-to-workspace path (graphsafe::ds4::GatherDecode: combine indices,
//                  gather the fp8 caches into a bf16 workspace [R, N + G, 512], sparse attention with
//                  sink), the path whose frozen N and G overwrite rows when sized at capture.
//   --path both    the two in turn.
// For each path and sizing policy it
//   1. captures one graph per batch bucket (8, 16, 32, 64 for --batch 64) in one capture family,
//   2. decodes a growth trace: requests with prompts of mixed lengths (short, medium, long, very long)
//      grow by one token per decode step past their capture-time lengths, the active batch varies so
//      every bucket is replayed (inactive slots are padded: seq_len 0),
//   3. every --check-every steps runs the same step eagerly and compares every layer's output with the
//      graph replay's, bit for bit,
// then prints a summary table (eager vs graph step time, guard cost per replay, workspace bytes per
// policy and what the family saved, checks).
//
//   --policy capacity      N and G by capacity_bound (seq_lens <= max_model_len)
//   --policy static-query  N by capacity_bound, G by static_query_bound(W) (ds4::Sizing::safe)
//   --policy exact         N (and G) exact at capture (the seed's sizing): debug mode's capture-time
//                          finding with its site, the guard refusing the replay that would have
//                          corrupted memory, then a re-capture at lengths rounded up (or, with
//                          --no-recapture, the error and the end of that run)
//   --policy all           the three in turn (default)
//
// Caches: layers of one type share their compressed cache, and all layers share one SWA cache (the
// caches of 43 layers at 64 x 64K tokens would be ~100 GiB and teach nothing more); every layer has
// its own queries, sinks, output, kernels and workspaces. Caches and queries are random but
// deterministic (--seed) and generated on the GPU.
//
// Without a CUDA device (or with --host) the same loop runs on the host backend: HostStream closures
// call the CPU reference (ds4::ref) with N and M frozen at capture, on tiny shapes (docs/ds4_model.md §7.3:
// W = 4, K = 8, max_model_len 512, H = 4); its paged path runs the reference indexer (scores with the
// frozen row stride, the selection rule) and attends over the paged index lists. The first line says
// which.
//
// Exit code: 0 when every check passed, 1 when a check failed (or an error), 2 on bad usage.
// Hidden test flag: --inject-corruption[=unguarded|flip] makes the run fail on purpose: `unguarded`
// (default) captures with exact sizing and replays with replay_unguarded_for_testing (the guard is
// bypassed: the gather overwrites rows, the comparison with eager must catch it; this mode always runs
// the gather path); `flip` flips one byte of a replay's output.
#include "ds4_decode_demo_kernels.hpp"

#include <graphsafe/graphsafe.hpp>
#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/device_problem.hpp>
#include <graphsafe/ds4/indexer_kernels.hpp>
#include <graphsafe/ds4/indexer_step.hpp>
#include <graphsafe/ds4/kernels.hpp>
#include <graphsafe/ds4/reference.hpp>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <cerrno>
#include <exception>
#include <filesystem>
#include <fstream>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

using namespace graphsafe;
namespace ds4 = graphsafe::ds4;

namespace {

// ------------------------------------------------------------------------------------------------
// Options

struct Options {
  std::string policy = "all";
  std::string path = "paged";  // paged, gather or both
  std::optional<int> layers, heads, batch, max_model_len, steps, check_every;
  std::uint64_t seed = 1;
  bool recapture = true;
  bool force_host = false;
  std::string json;
  std::string inject;  // "", "unguarded", "flip"
  std::optional<double> torch_pool_bytes;  // PyTorch's graph pool on the gather path's pattern (capture_memory_bench)
  std::string command;
};

struct Shapes {
  int layers = 43, heads = 64, batch = 64, max_model_len = 65536, steps = 64, check_every = 8;
  int window = 128, topk = 512, swa_block_tokens = 64;
  std::vector<int> buckets;  // ascending; the last one is `batch`
};

// Upper limits of the sizes, checked before any work (element counts stay far inside the kernels'
// 32-bit indices). Within them, the memory a run needs is estimated from measurements of this demo,
// per layer x request x token of max_model_len: ~2.6 KB of host memory on the host path (per-layer
// problems, caches and workspaces all live in host memory) and ~160 B of device memory on the CUDA
// path (mostly the family's workspace region: 22.6 GiB at 43 x 64 x 65,536).
struct Limits {
  int layers, heads, batch, max_model_len, steps;
};
constexpr Limits kLimits{128, 128, 1024, 1 << 20, 1 << 20};
constexpr double kHostBytesPerUnit = 2600;
constexpr double kDeviceBytesPerUnit = 160;

const char* const kDescription =
    "An attention-only DS4 decode loop over a V4-Flash-like layer schedule (2 SWA-only layers, then C4\n"
    "and C128 alternating): one graph per batch bucket in one capture family, a growth trace replayed\n"
    "and checked against eager bit for bit every --check-every steps. --path paged (default): the C4\n"
    "layers' lightning indexer picks the rows, attention reads the paged fp8 caches; --path gather: the\n"
    "rows are gathered into a workspace first; --path both: the two in turn.\n"
    "GPU defaults: --layers 43 --heads 64 --batch 64 --max-model-len 65536 --steps 64 --check-every 8\n"
    "host defaults (no CUDA device, or --host): --heads 4 --batch 4 --max-model-len 512 --steps 16\n"
    "  --check-every 4, window 4, top-k 8\n"
    "limits: --layers 128, --heads 128, --batch 1024, --max-model-len 1048576, --steps 1048576, and the\n"
    "  memory of the machine (estimated before the run: layers x batch x max-model-len x ~2.6 KB of host\n"
    "  memory on the host path, ~160 B of device memory on the CUDA path)";

// Parses argv with CLI11. Bad arguments: one line on stderr naming the option, the value and what is
// allowed, then exit code 2. --help: the usage on stdout, exit 0.
std::optional<Options> parse(int argc, char** argv, int& exit_code) {
  Options o;
  for (int i = 0; i < argc; ++i) {
    if (i) o.command += ' ';
    o.command += argv[i];
  }
  CLI::App app(kDescription, "ds4_decode_demo");
  app.add_option("--policy", o.policy, "all, capacity, static-query or exact")
      ->check(CLI::IsMember({"all", "capacity", "static-query", "exact"}));
  app.add_option("--path", o.path, "paged (indexer + paged-direct attention), gather (gather to a workspace) or both")
      ->check(CLI::IsMember({"paged", "gather", "both"}));
  app.add_option("--layers", o.layers, "attention layers")->check(CLI::Range(1, kLimits.layers));
  app.add_option("--heads", o.heads, "query heads (the CUDA kernels take 64 or 128)")
      ->check(CLI::Range(1, kLimits.heads));
  app.add_option("--batch", o.batch, "largest batch bucket (the buckets halve down to batch / 8)")
      ->check(CLI::Range(1, kLimits.batch));
  app.add_option("--max-model-len", o.max_model_len, "longest sequence")
      ->check(CLI::Range(16, kLimits.max_model_len));
  app.add_option("--steps", o.steps, "decode steps")->check(CLI::Range(1, kLimits.steps));
  app.add_option("--check-every", o.check_every, "compare replay with eager every N steps")
      ->check(CLI::Range(1, kLimits.steps));
  app.add_option("--seed", o.seed, "seed of the inputs and the trace");
  app.add_flag("--no-recapture", [&o](std::int64_t) { o.recapture = false; },
               "stop at the first refused replay instead of re-capturing");
  app.add_option("--json", o.json, "write the figures as JSON records to this file");
  app.add_flag("--host", o.force_host, "run on the host backend even with a CUDA device");
  app.add_option("--torch-pool-bytes", o.torch_pool_bytes,
                 "PyTorch's graph pool on the gather path's allocation pattern (bench/torch_capture_pool.py), shown "
                 "beside the gather path's regions")
      ->check(CLI::PositiveNumber);
  // Test hook (hidden): make the run fail on purpose, see the header comment.
  auto* inject = app.add_option("--inject-corruption", o.inject)
                     ->expected(0, 1)
                     ->check(CLI::IsMember({"", "unguarded", "flip"}))
                     ->group("");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    exit_code = app.exit(e);
    return std::nullopt;
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "ds4_decode_demo: %s (--help lists the options)\n", e.what());
    exit_code = 2;
    return std::nullopt;
  }
  if (inject->count() > 0 && o.inject.empty()) o.inject = "unguarded";
  return o;
}

// The sizes against the limits and the memory of the backend that will run them, and the --json
// path, before any work: a bad value is one line on stderr naming the value and the limit, exit 2.
bool check_inputs(const Shapes& sh, const Options& opt, bool gpu) {
  auto within = [&](const char* name, int value, int limit) {
    if (value <= limit) return true;
    std::fprintf(stderr, "ds4_decode_demo: %s %d exceeds the limit %d\n", name, value, limit);
    return false;
  };
  if (!within("--layers", sh.layers, kLimits.layers) || !within("--heads", sh.heads, kLimits.heads) ||
      !within("--batch", sh.batch, kLimits.batch) || !within("--max-model-len", sh.max_model_len, kLimits.max_model_len) ||
      !within("--steps", sh.steps, kLimits.steps))
    return false;
  if (gpu && sh.heads != 64 && sh.heads != 128) {
    std::fprintf(stderr, "ds4_decode_demo: the CUDA kernels take --heads 64 or 128 (got %d)\n", sh.heads);
    return false;
  }
  if (sh.max_model_len < 8 * sh.window || sh.steps * 4 > sh.max_model_len) {
    std::fprintf(stderr, "ds4_decode_demo: --max-model-len %d must be >= 8 x window (%d) and >= 4 x --steps (%d)\n",
                 sh.max_model_len, sh.window, sh.steps);
    return false;
  }
  const double units = static_cast<double>(sh.layers) * sh.batch * sh.max_model_len;
  double have = 0;
  if (gpu) {
    std::size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) have = static_cast<double>(free_bytes);
  } else {
    const long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGE_SIZE);
    if (pages > 0 && page > 0) have = static_cast<double>(pages) * static_cast<double>(page);
  }
  const double need = units * (gpu ? kDeviceBytesPerUnit : kHostBytesPerUnit);
  if (have > 0 && need > have) {
    std::fprintf(stderr,
                 "ds4_decode_demo: --layers %d x --batch %d x --max-model-len %d needs about %.1f GiB of %s memory "
                 "(~%.0f B each), more than the %.1f GiB %s\n",
                 sh.layers, sh.batch, sh.max_model_len, need / (1ull << 30), gpu ? "device" : "host",
                 gpu ? kDeviceBytesPerUnit : kHostBytesPerUnit, have / (1ull << 30),
                 gpu ? "free on the device" : "this machine has");
    return false;
  }
  if (!opt.json.empty()) {
    // Open for appending: tells whether the file can be written without truncating an existing one.
    const bool existed = std::filesystem::exists(opt.json);
    std::ofstream probe(opt.json, std::ios::app);
    if (!probe) {
      std::fprintf(stderr, "ds4_decode_demo: --json %s cannot be written (%s)\n", opt.json.c_str(),
                   std::strerror(errno));
      return false;
    }
    probe.close();
    if (!existed) std::filesystem::remove(opt.json);
  }
  return true;
}

// ------------------------------------------------------------------------------------------------
// Model, shapes, trace

// Resolved shapes (defaults depend on the backend).
// V4-Flash schedule (docs/ds4_model.md §1): layers 0, 1 SWA-only; then even layers C4, odd layers C128.
int layer_ratio(int l) { return l < 2 ? 1 : (l % 2 == 0 ? 4 : 128); }
int type_index(int ratio) { return ratio == 1 ? 0 : (ratio == 4 ? 1 : 2); }
const char* type_name(int t) { return t == 0 ? "C1" : (t == 1 ? "C4" : "C128"); }

ds4::LayerConfig layer_config(const Shapes& sh, int ratio) {
  ds4::LayerConfig c;
  c.ratio = ratio;
  c.window = sh.window;
  c.topk = sh.topk;
  c.heads = sh.heads;
  c.max_model_len = sh.max_model_len;
  c.swa_block_tokens = sh.swa_block_tokens;
  return c;
}

std::uint64_t mix(std::uint64_t x) {
  x ^= x >> 33;
  x *= 0xff51afd7ed558ccdULL;
  x ^= x >> 33;
  x *= 0xc4ceb9fe1a85ec53ULL;
  x ^= x >> 33;
  return x;
}

// C4 indexer picks for one request: all ids when n_c <= K, else K distinct ids spread over [0, n_c)
// that always include the newest compressed row n_c - 1 (recent context is attended), valid first,
// -1 padded. Deterministic in (n_c, seed).
void make_picks(int n_c, int K, std::uint64_t seed, std::int32_t* row) {
  std::fill(row, row + K, -1);
  if (n_c <= K) {
    for (int i = 0; i < n_c; ++i) row[i] = i;
    return;
  }
  const std::int64_t spread = n_c / K;  // >= 1
  for (int i = 0; i < K - 1; ++i) {
    const std::int64_t base = static_cast<std::int64_t>(i) * n_c / K;
    row[i] = static_cast<std::int32_t>(base + static_cast<std::int64_t>(mix(seed * 7919 + i) % spread));
  }
  row[K - 1] = n_c - 1;
}

// The decode trace: `batch` slots with prompts of mixed lengths; each step the first active(step)
// requests decode one token (their lengths grow), the rest wait (padded with seq_len 0).
struct Trace {
  std::vector<std::int32_t> lens;
  int batch = 0;
  bool all_active = false;

  Trace(const Shapes& sh, std::uint64_t seed, bool all) : batch(sh.batch), all_active(all) {
    std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ULL + 17);
    const int W = sh.window, L = sh.max_model_len, top = L - sh.steps - 1;
    const int bounds[5] = {1, W, std::max(W + 1, L / 8), std::max(W + 2, L / 2), top};
    lens.resize(batch);
    for (int i = 0; i < batch; ++i) {
      const int c = i % 4;  // short (<= W), medium, long, very long
      const int lo = std::min(bounds[c] + (c ? 1 : 0), top), hi = std::min(bounds[c + 1], top);
      lens[i] = std::uniform_int_distribution<int>(lo, std::max(lo, hi))(rng);
    }
  }
  int active(int step) const {
    if (all_active) return batch;
    static constexpr double frac[5] = {1.0, 0.7, 0.45, 0.2, 0.1};
    return std::max(1, static_cast<int>(std::ceil(batch * frac[step % 5])));
  }
  // Lengths bound for a graph of `bucket` slots: the first n active, then padding.
  std::vector<std::int32_t> bucket_lens(int n, int bucket) const {
    std::vector<std::int32_t> v(bucket, 0);
    std::copy(lens.begin(), lens.begin() + std::min(n, bucket), v.begin());
    return v;
  }
  void advance(int n) {
    for (int i = 0; i < n; ++i) ++lens[i];
  }
};

int bucket_index(const Shapes& sh, int n) {
  for (std::size_t i = 0; i < sh.buckets.size(); ++i)
    if (sh.buckets[i] >= n) return static_cast<int>(i);
  return static_cast<int>(sh.buckets.size()) - 1;
}

std::string show_bytes(double b) {
  char buf[64];
  if (b >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", b / (1ull << 30));
  else if (b >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1ull << 20));
  else if (b >= 1024)
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / 1024);
  else
    std::snprintf(buf, sizeof buf, "%.0f B", b);
  return buf;
}

std::uint64_t align256(std::uint64_t x) { return (x + 255) / 256 * 256; }

// ------------------------------------------------------------------------------------------------
// Engines: where the layers run. Both size N, G and every workspace through the arena with the same
// extents and policies (ds4::compressed_rows_policy / swa_rows_policy).

enum class DecodePath { paged, gather };
const char* path_name(DecodePath p) { return p == DecodePath::paged ? "paged" : "gather"; }

class Engine {
 public:
  virtual ~Engine() = default;
  virtual Backend& backend() = 0;
  virtual Stream stream() = 0;
  // Use this arena, sizing and decode path for the next policy's run.
  virtual void bind(Arena& arena, ds4::Sizing sizing, DecodePath path) = 0;
  // Bytes a capture of bucket `bi` may take (every policy reserves at most the capacity bound).
  virtual std::uint64_t capture_bytes_upper_bound(int bi) = 0;
  // Stream-ordered update of the lengths (and C4 picks) the kernels read, for bucket bi.
  virtual void set_lengths(int bi, const std::vector<std::int32_t>& lens) = 0;
  // Enqueue every layer of one decode step (capturable); `graph` selects the graph's output buffers.
  virtual void run_layers(int bi, const Bindings& b, bool graph) = 0;
  virtual void poison(int bi, bool graph) = 0;
  virtual std::uint64_t differing_bytes(int bi) = 0;  // graph vs eager outputs (synchronizes)
  virtual bool graph_output_untouched(int bi) = 0;    // still poisoned
  virtual void corrupt_graph_output() = 0;            // flip one byte (test mode)
  // Largest relative error of the eager outputs against the independent reference (host only).
  virtual std::optional<double> reference_error(int) { return std::nullopt; }
  virtual void timer_start() = 0;
  virtual double timer_stop_ms() = 0;
  virtual void synchronize() = 0;
  virtual std::string machine() const = 0;
  virtual bool is_host() const = 0;
};

constexpr std::uint8_t kPoison = 0xFF;

// ---- CUDA --------------------------------------------------------------------------------------

#define DEMO_CUDA(call) GRAPHSAFE_CUDA(call)

class CudaEngine final : public Engine {
 public:
  CudaEngine(const Shapes& sh, const ds4::Ds4Symbols& syms, std::uint64_t seed, std::string machine)
      : sh_(sh), syms_(syms), machine_(std::move(machine)) {
    DEMO_CUDA(cudaStreamCreateWithFlags(&st_, cudaStreamNonBlocking));
    DEMO_CUDA(cudaEventCreate(&e0_));
    DEMO_CUDA(cudaEventCreate(&e1_));
    backend_ = std::make_unique<CudaBackend>();
    for (int t = 0; t < 3; ++t) cfg_[t] = layer_config(sh, t == 0 ? 1 : (t == 1 ? 4 : 128));
    bool have[3] = {false, false, false};
    for (int l = 0; l < sh.layers; ++l) have[type_index(layer_ratio(l))] = true;
    const int B = sh.batch, H = sh.heads;

    // One SWA cache (full history, docs/ds4_model.md §7.2) shared by every layer; block tables are a fixed
    // permutation of the physical blocks.
    swa_bpr_ = (sh.max_model_len + sh.swa_block_tokens - 1) / sh.swa_block_tokens;
    const int swa_blocks = B * swa_bpr_;
    const std::size_t swa_stride = ds4::block_stride_bytes(sh.swa_block_tokens);
    swa_mem_ = ds4::cuda::device_alloc(static_cast<std::size_t>(swa_blocks) * swa_stride);
    DEMO_CUDA(ds4_demo::fill_cache(swa_mem_.get(), static_cast<std::size_t>(swa_blocks) * swa_stride,
                                   sh.swa_block_tokens, swa_stride, seed * 1000 + 1, st_));
    swa_ = {swa_mem_.get(), sh.swa_block_tokens, swa_blocks, swa_stride};
    swa_table_ = upload_table(B, swa_bpr_, seed + 11);
    for (int t = 1; t < 3; ++t) {
      if (!have[t]) continue;
      const int E = cfg_[t].compressed_block_entries();
      cmp_bpr_[t] = (cfg_[t].compressed_capacity() + E - 1) / E;
      const int blocks = B * cmp_bpr_[t];
      const std::size_t stride = ds4::block_stride_bytes(E);
      cmp_mem_[t] = ds4::cuda::device_alloc(static_cast<std::size_t>(blocks) * stride);
      DEMO_CUDA(ds4_demo::fill_cache(cmp_mem_[t].get(), static_cast<std::size_t>(blocks) * stride, E, stride,
                                     seed * 1000 + 2 + t, st_));
      cmp_[t] = {cmp_mem_[t].get(), E, blocks, stride};
      cmp_table_[t] = upload_table(B, cmp_bpr_[t], seed + 20 + t);
    }
    lens_mem_ = ds4::cuda::device_alloc(sizeof(std::int32_t) * B);
    topk_mem_ = ds4::cuda::device_alloc(sizeof(std::int32_t) * B * sh.topk);
    DEMO_CUDA(cudaMemsetAsync(lens_mem_.get(), 0, sizeof(std::int32_t) * B, st_));
    DEMO_CUDA(cudaMemsetAsync(topk_mem_.get(), 0xFF, sizeof(std::int32_t) * B * sh.topk, st_));
    // The paged path's indexer (C4 layers): one key cache shared by the C4 layers (paged like their
    // compressed cache, same block table), per-layer fp8 queries and head weights, and the top-k it
    // writes for the attention.
    if (have[1]) {
      ds4::IndexerCache ic;
      ic.num_blocks = B * cmp_bpr_[1];
      const std::size_t ibytes = static_cast<std::size_t>(ic.num_blocks) * ic.stride;
      icache_mem_ = ds4::cuda::device_alloc(ibytes);
      ic.base = icache_mem_.get();
      DEMO_CUDA(ds4_demo::fill_indexer_cache(ic.base, ibytes, ic.block_rows, ic.stride, seed * 1000 + 5, st_));
      const std::size_t qbytes = static_cast<std::size_t>(B) * ds4::kIndexerHeads * ds4::kIndexerDim;
      const std::size_t wcount = static_cast<std::size_t>(B) * ds4::kIndexerHeads;
      iq_mem_ = ds4::cuda::device_alloc(qbytes * sh.layers);
      iw_mem_ = ds4::cuda::device_alloc(wcount * 4 * sh.layers);
      DEMO_CUDA(ds4_demo::fill_fp8(iq_mem_.get(), qbytes * sh.layers, seed * 1000 + 6, st_));
      DEMO_CUDA(ds4_demo::fill_f32(reinterpret_cast<float*>(iw_mem_.get()), wcount * sh.layers, -0.5f, 0.5f,
                                   seed * 1000 + 8, st_));
      ix_in_.resize(sh.layers);
      for (int l = 0; l < sh.layers; ++l) {
        ix_in_[l].cache = ic;
        ix_in_[l].q = iq_mem_.get() + qbytes * l;
        ix_in_[l].weights = reinterpret_cast<float*>(iw_mem_.get()) + wcount * l;
      }
      itopk_mem_ = ds4::cuda::device_alloc(sizeof(std::int32_t) * B * sh.topk);
      DEMO_CUDA(cudaMemsetAsync(itopk_mem_.get(), 0xFF, sizeof(std::int32_t) * B * sh.topk, st_));
    }
    out_elems_ = static_cast<std::size_t>(B) * H * ds4::kHeadDim;
    q_mem_ = ds4::cuda::device_alloc(out_elems_ * 2 * sh.layers);
    DEMO_CUDA(ds4_demo::fill_bf16(reinterpret_cast<std::uint16_t*>(q_mem_.get()), out_elems_ * sh.layers,
                                  seed * 1000 + 7, st_));
    std::vector<float> sink(static_cast<std::size_t>(H) * sh.layers);
    for (std::size_t i = 0; i < sink.size(); ++i) sink[i] = -2.f + 4.f * static_cast<float>(mix(seed + i) % 1000) / 1000.f;
    sink_mem_ = ds4::cuda::device_alloc(sink.size() * 4);
    DEMO_CUDA(cudaMemcpy(sink_mem_.get(), sink.data(), sink.size() * 4, cudaMemcpyHostToDevice));
    out_graph_ = ds4::cuda::device_alloc(out_elems_ * 2 * sh.layers);
    out_eager_ = ds4::cuda::device_alloc(out_elems_ * 2 * sh.layers);
    count_mem_ = ds4::cuda::device_alloc(sizeof(unsigned long long));
    host_lens_.assign(B, 0);
    host_picks_.assign(static_cast<std::size_t>(B) * sh.topk, -1);

    // Per layer and bucket: a non-owning view (batch = bucket, the layer's queries and sinks); the
    // paged path's C4 views read the indexer's top-k instead of the host-made picks.
    views_.resize(sh.layers);
    paged_views_.resize(sh.layers);
    for (int l = 0; l < sh.layers; ++l) {
      const int t = type_index(layer_ratio(l));
      for (int R : sh.buckets)
        for (const bool paged : {false, true}) {
        ds4::cuda::DeviceProblem v;
        v.cfg = cfg_[t];
        v.batch = R;
        v.swa = swa_;
        v.swa_block_table = reinterpret_cast<std::int32_t*>(swa_table_.get());
        v.swa_blocks_per_req = swa_bpr_;
        if (t > 0) {
          v.cmp = cmp_[t];
          v.cmp_block_table = reinterpret_cast<std::int32_t*>(cmp_table_[t].get());
          v.cmp_blocks_per_req = cmp_bpr_[t];
        }
        v.seq_lens = reinterpret_cast<std::int32_t*>(lens_mem_.get());
        v.topk_local = t == 1 ? reinterpret_cast<std::int32_t*>((paged ? itopk_mem_ : topk_mem_).get()) : nullptr;
        v.q = reinterpret_cast<std::uint16_t*>(q_mem_.get()) + out_elems_ * l;
        v.sink = reinterpret_cast<float*>(sink_mem_.get()) + static_cast<std::size_t>(H) * l;
        (paged ? paged_views_ : views_)[l].push_back(std::move(v));
      }
    }
    DEMO_CUDA(cudaStreamSynchronize(st_));
  }
  ~CudaEngine() override {
    cudaStreamSynchronize(st_);
    cudaEventDestroy(e0_);
    cudaEventDestroy(e1_);
    cudaStreamDestroy(st_);
  }

  Backend& backend() override { return *backend_; }
  Stream stream() override { return st_; }
  void bind(Arena& arena, ds4::Sizing sizing, DecodePath path) override {
    path_ = path;
    for (int t = 0; t < 3; ++t) {
      gd_[t].reset();
      pd_[t].reset();
      if (path == DecodePath::gather)
        gd_[t] = std::make_unique<ds4::GatherDecode>(arena, cfg_[t], syms_, sizing);
      else
        pd_[t] = std::make_unique<ds4::PagedDecode>(arena, cfg_[t], syms_);
    }
    ix_.reset();
    if (path == DecodePath::paged && !ix_in_.empty())
      ix_ = std::make_unique<ds4::IndexerDecode>(arena, cfg_[1], syms_, sizing);
  }
  std::uint64_t capture_bytes_upper_bound(int bi) override {
    const std::uint64_t R = static_cast<std::uint64_t>(sh_.buckets[bi]);
    std::uint64_t total = 1 << 20;
    for (int l = 0; l < sh_.layers; ++l) {
      const ds4::LayerConfig& c = cfg_[type_index(layer_ratio(l))];
      const std::uint64_t N = c.ratio > 1 ? static_cast<std::uint64_t>(c.max_model_len / c.ratio) : 0;
      const std::uint64_t M = N + static_cast<std::uint64_t>(std::min(c.window, c.max_model_len));
      const int width = c.combined_width();
      const int splits = ds4::cuda::choose_splits(static_cast<int>(R), c.heads, width, ds4::cuda::device_sm_count());
      total += align256(ds4::cuda::sparse_attention_scratch_bytes(static_cast<int>(R), c.heads, splits)) + 4 * 512;
      if (path_ == DecodePath::gather) {
        total += align256(R * M * ds4::kHeadDim * 2) + align256(R * width * 4) + align256(R * 4);
      } else {  // paged index lists and lengths, C4: the indexer's logits [R, N]
        total += align256(R * std::max(c.compressed_width(), 1) * 4) + align256(R * c.window * 4) + 2 * align256(R * 4);
        if (c.ratio == 4) total += align256(R * N * 4);
      }
    }
    return total;
  }
  void set_lengths(int bi, const std::vector<std::int32_t>& lens) override {
    const int R = sh_.buckets[bi], K = sh_.topk;
    // The previous step's copies have finished (every step synchronizes): safe to rewrite.
    std::copy(lens.begin(), lens.end(), host_lens_.begin());
    for (int b = 0; b < R; ++b) make_picks(lens[b] / 4, K, 31 + static_cast<std::uint64_t>(b), &host_picks_[static_cast<std::size_t>(b) * K]);
    DEMO_CUDA(cudaMemcpyAsync(lens_mem_.get(), host_lens_.data(), sizeof(std::int32_t) * R, cudaMemcpyHostToDevice, st_));
    DEMO_CUDA(cudaMemcpyAsync(topk_mem_.get(), host_picks_.data(), sizeof(std::int32_t) * R * K,
                              cudaMemcpyHostToDevice, st_));
    DEMO_CUDA(cudaStreamSynchronize(st_));
  }
  void run_layers(int bi, const Bindings& b, bool graph) override {
    auto* out = reinterpret_cast<std::uint16_t*>((graph ? out_graph_ : out_eager_).get());
    for (int l = 0; l < sh_.layers; ++l) {
      const int t = type_index(layer_ratio(l));
      if (path_ == DecodePath::gather) {
        gd_[t]->run(st_, views_[l][bi], b, out + out_elems_ * l);
        continue;
      }
      const ds4::cuda::DeviceProblem& v = paged_views_[l][bi];
      if (t == 1)  // the indexer's top-k writes the attention's index lists (no combine launch)
        pd_[t]->run(st_, v, *ix_, ix_in_[l], b, out + out_elems_ * l);
      else
        pd_[t]->run(st_, v, b, out + out_elems_ * l);
    }
  }
  void poison(int bi, bool graph) override {
    (void)bi;
    DEMO_CUDA(cudaMemsetAsync((graph ? out_graph_ : out_eager_).get(), kPoison, out_elems_ * 2 * sh_.layers, st_));
  }
  std::uint64_t differing_bytes(int bi) override {
    return count([&](unsigned long long* c) {
      return ds4_demo::count_differences(out_graph_.get(), out_eager_.get(), sh_.layers, out_elems_ * 2,
                                         bucket_bytes(bi), c, st_);
    });
  }
  bool graph_output_untouched(int bi) override {
    return count([&](unsigned long long* c) {
             return ds4_demo::count_not_equal(out_graph_.get(), kPoison, sh_.layers, out_elems_ * 2, bucket_bytes(bi), c,
                                              st_);
           }) == 0;
  }
  void corrupt_graph_output() override {
    std::uint8_t byte = 0;
    DEMO_CUDA(cudaStreamSynchronize(st_));
    DEMO_CUDA(cudaMemcpy(&byte, out_graph_.get(), 1, cudaMemcpyDeviceToHost));
    byte ^= 0x01;
    DEMO_CUDA(cudaMemcpy(out_graph_.get(), &byte, 1, cudaMemcpyHostToDevice));
  }
  void timer_start() override { DEMO_CUDA(cudaEventRecord(e0_, st_)); }
  double timer_stop_ms() override {
    DEMO_CUDA(cudaEventRecord(e1_, st_));
    DEMO_CUDA(cudaEventSynchronize(e1_));
    float ms = 0;
    DEMO_CUDA(cudaEventElapsedTime(&ms, e0_, e1_));
    return ms;
  }
  void synchronize() override { DEMO_CUDA(cudaStreamSynchronize(st_)); }
  std::string machine() const override { return machine_; }
  bool is_host() const override { return false; }

 private:
  ds4::cuda::DeviceBytes upload_table(int B, int per_req, std::uint64_t seed) {
    // Logical block i of request b -> physical (i_global * a) mod total, a odd and coprime: a bijection.
    const std::int64_t total = static_cast<std::int64_t>(B) * per_req;
    std::int64_t a = 7919 + 2 * static_cast<std::int64_t>(seed % 64);
    while (std::gcd(a, total) != 1) a += 2;
    std::vector<std::int32_t> t(static_cast<std::size_t>(total));
    for (std::int64_t i = 0; i < total; ++i) t[static_cast<std::size_t>(i)] = static_cast<std::int32_t>((i * a + 3) % total);
    auto d = ds4::cuda::device_alloc(t.size() * 4);
    DEMO_CUDA(cudaMemcpy(d.get(), t.data(), t.size() * 4, cudaMemcpyHostToDevice));
    return d;
  }
  std::size_t bucket_bytes(int bi) const {
    return static_cast<std::size_t>(sh_.buckets[bi]) * sh_.heads * ds4::kHeadDim * 2;
  }
  template <class F>
  std::uint64_t count(F&& launch) {
    DEMO_CUDA(cudaMemsetAsync(count_mem_.get(), 0, sizeof(unsigned long long), st_));
    DEMO_CUDA(launch(reinterpret_cast<unsigned long long*>(count_mem_.get())));
    unsigned long long n = 0;
    DEMO_CUDA(cudaMemcpyAsync(&n, count_mem_.get(), sizeof n, cudaMemcpyDeviceToHost, st_));
    DEMO_CUDA(cudaStreamSynchronize(st_));
    return n;
  }

  Shapes sh_;
  const ds4::Ds4Symbols& syms_;
  std::string machine_;
  cudaStream_t st_ = nullptr;
  cudaEvent_t e0_ = nullptr, e1_ = nullptr;
  std::unique_ptr<CudaBackend> backend_;
  ds4::LayerConfig cfg_[3];
  DecodePath path_ = DecodePath::paged;
  std::unique_ptr<ds4::GatherDecode> gd_[3];
  std::unique_ptr<ds4::PagedDecode> pd_[3];
  std::unique_ptr<ds4::IndexerDecode> ix_;
  std::vector<ds4::cuda::DeviceIndexerInputs> ix_in_;  // per layer (C4 layers only use theirs)
  ds4::cuda::DeviceBytes icache_mem_, iq_mem_, iw_mem_, itopk_mem_;
  ds4::cuda::DeviceBytes swa_mem_, swa_table_, cmp_mem_[3], cmp_table_[3], lens_mem_, topk_mem_, q_mem_, sink_mem_,
      out_graph_, out_eager_, count_mem_;
  ds4::PagedCache swa_{}, cmp_[3]{};
  int swa_bpr_ = 0, cmp_bpr_[3] = {0, 0, 0};
  std::size_t out_elems_ = 0;
  std::vector<std::int32_t> host_lens_, host_picks_;
  std::vector<std::vector<ds4::cuda::DeviceProblem>> views_, paged_views_;
};

// ---- host (CPU reference path) ----------------------------------------------------------------

// The gather path's three kernels as host closures over a DecodeProblem whose seq_lens / picks are
// read when the closure runs (like device memory), with N, M and the workspace frozen at capture.
// Like the CUDA kernel, the gather does no bound check against N or M (the seed's overlap is
// reproduced); unlike it, rows past the whole workspace are dropped so the host process stays sound.
void host_combine(const ds4::DecodeProblem& p, std::int64_t N, std::int64_t M, int width, std::int32_t* idx,
                  std::int32_t* lens) {
  for (int b = 0; b < p.batch; ++b) {
    std::int32_t* row = idx + static_cast<std::size_t>(b) * width;
    std::fill(row, row + width, -1);
    const int L = p.seq_lens[b];
    int k = 0;
    if (L > 0) {
      for (int c : ds4::ref::compressed_picks(p, b))
        if (k < width) row[k++] = static_cast<std::int32_t>(b * M + c);
      const int g = ds4::swa_len(L, p.cfg.window);
      for (int j = 0; j < g && k < width; ++j) row[k++] = static_cast<std::int32_t>(b * M + N + j);
    }
    lens[b] = k;
  }
}

void host_gather(const ds4::DecodeProblem& p, std::int64_t N, std::int64_t M, std::int64_t ws_rows, float* ws) {
  const ds4::PagedCache swa = ds4::ref::swa_view(p);
  const ds4::PagedCache cmp = ds4::ref::cmp_view(p);
  for (int b = 0; b < p.batch; ++b) {
    const int L = p.seq_lens[b];
    const int n_c = ds4::visible_compressed(L, p.cfg.ratio);
    for (int c = 0; c < n_c; ++c) {
      const std::int64_t row = b * M + c;
      if (row < ws_rows) ds4::ref::dequantize_row(cmp, ds4::ref::compressed_slot(p, b, c), ws + row * ds4::kHeadDim);
    }
    const int g = ds4::swa_len(L, p.cfg.window);
    for (int i = 0; i < g; ++i) {
      const std::int64_t row = b * M + N + i;
      if (row < ws_rows) ds4::ref::dequantize_row(swa, ds4::ref::swa_slot(p, b, L - g + i), ws + row * ds4::kHeadDim);
    }
  }
}

// The paged path's closures. The indexer mirrors IndexerDecode on the GPU: request b's scores at
// logits[b * N + s] for its first min(n_c, N) rows (N frozen at capture; rows past the logits buffer
// are dropped), then the selection rule over those rows into p.topk_local.
void host_indexer(ds4::DecodeProblem& p, const ds4::ref::IndexerInputs& in, std::int64_t N, float* logits,
                  std::int64_t logit_rows) {
  const int K = p.cfg.topk;
  std::vector<float> q(ds4::kIndexerHeads * ds4::kIndexerDim);
  for (int b = 0; b < p.batch; ++b) {
    const int n_c = std::max(p.seq_lens[b], 0) / ds4::kIndexerRatio;
    const int n = static_cast<int>(std::min<std::int64_t>(n_c, N));
    for (std::size_t i = 0; i < q.size(); ++i)
      q[i] = ds4::ref::fp8_e4m3_to_float(in.q[static_cast<std::size_t>(b) * q.size() + i]);
    const std::vector<float> sc = ds4::ref::indexer_scores(
        in.cache, p.cmp_block_table.data() + static_cast<std::size_t>(b) * p.cmp_blocks_per_req, n, q.data(),
        in.weights.data() + static_cast<std::size_t>(b) * ds4::kIndexerHeads);
    for (int s = 0; s < n; ++s)
      if (b * N + s < logit_rows) logits[b * N + s] = sc[static_cast<std::size_t>(s)];
    std::vector<float> row(static_cast<std::size_t>(n));
    for (int s = 0; s < n; ++s) row[static_cast<std::size_t>(s)] = b * N + s < logit_rows ? logits[b * N + s] : 0.f;
    const std::vector<std::int32_t> top = ds4::ref::indexer_topk(row.data(), n_c <= K ? n_c : n, K);
    std::copy(top.begin(), top.end(), p.topk_local.begin() + static_cast<std::ptrdiff_t>(b) * K);
  }
}

// Paged-direct attention on the host: the rows named by the paged index lists (global slots of the
// compressed and SWA caches, ref::combine_paged) dequantized in list order, then the reference
// attention over them. Independent of ref::sparse_attention's own walk of the block tables.
void host_paged_attention(const ds4::DecodeProblem& p, const std::int32_t* cmp_idx, const std::int32_t* cmp_lens,
                          const std::int32_t* swa_idx, const std::int32_t* swa_lens, float* out) {
  const int cw = p.cfg.compressed_width(), W = p.cfg.window, width = cw + W;
  const ds4::PagedCache swa = ds4::ref::swa_view(p);
  const ds4::PagedCache cmp = ds4::ref::cmp_view(p);
  std::vector<float> ws;
  std::vector<std::int32_t> idx(static_cast<std::size_t>(p.batch) * width, -1), lens(p.batch, 0);
  for (int b = 0; b < p.batch; ++b) {
    auto add = [&](const ds4::PagedCache& c, std::int64_t slot) {
      const std::size_t row = ws.size() / ds4::kHeadDim;
      ws.resize(ws.size() + ds4::kHeadDim);
      ds4::ref::dequantize_row(c, slot, ws.data() + row * ds4::kHeadDim);
      idx[static_cast<std::size_t>(b) * width + lens[b]++] = static_cast<std::int32_t>(row);
    };
    for (int i = 0; cmp_lens != nullptr && i < cmp_lens[b]; ++i) add(cmp, cmp_idx[static_cast<std::size_t>(b) * cw + i]);
    for (int i = 0; i < swa_lens[b]; ++i) add(swa, swa_idx[static_cast<std::size_t>(b) * W + i]);
  }
  ds4::ref::attention_over_workspace(p, ws.data(), static_cast<std::int64_t>(ws.size() / ds4::kHeadDim), idx.data(),
                                     lens.data(), width, out);
}

class HostEngine final : public Engine {
 public:
  HostEngine(const Shapes& sh, const ds4::Ds4Symbols& syms, std::uint64_t seed) : sh_(sh), syms_(syms) {
    for (int t = 0; t < 3; ++t) cfg_[t] = layer_config(sh, t == 0 ? 1 : (t == 1 ? 4 : 128));
    const std::size_t nb = sh.buckets.size();
    problems_.resize(sh.layers);
    ix_in_.resize(sh.layers);
    // One problem per layer type and bucket (caches shared by the layers of a type), copied per layer
    // with the layer's own queries and sinks.
    std::vector<std::vector<std::optional<ds4::DecodeProblem>>> base(3, std::vector<std::optional<ds4::DecodeProblem>>(nb));
    for (int l = 0; l < sh.layers; ++l) {
      const int t = type_index(layer_ratio(l));
      for (std::size_t bi = 0; bi < nb; ++bi) {
        const int R = sh.buckets[bi];
        if (!base[t][bi])
          base[t][bi] = ds4::make_problem(cfg_[t], std::vector<std::int32_t>(R, 1), seed * 100 + t * 10 + bi,
                                          ds4::Picks::random, sh.max_model_len);
        ds4::DecodeProblem p = *base[t][bi];
        std::mt19937_64 rng(seed * 1000003 + l * 131 + bi);
        std::uniform_real_distribution<float> u(-1.f, 1.f);
        for (auto& x : p.q) x = ds4::ref::bf16_from_float(u(rng));
        for (auto& s : p.sink) s = 2.f * u(rng);
        if (t == 1) ix_in_[l].push_back(ds4::ref::make_indexer_inputs(p, seed * 7 + l * 13 + bi));
        problems_[l].push_back(std::move(p));
      }
    }
    const std::size_t elems = static_cast<std::size_t>(sh.batch) * sh.heads * ds4::kHeadDim;
    out_graph_.assign(sh.layers, std::vector<float>(elems));
    out_eager_.assign(sh.layers, std::vector<float>(elems));
  }
  Backend& backend() override { return backend_; }
  Stream stream() override { return hs_; }
  void bind(Arena& arena, ds4::Sizing sizing, DecodePath path) override {
    arena_ = &arena;
    sizing_ = sizing;
    path_ = path;
  }
  std::uint64_t capture_bytes_upper_bound(int bi) override {
    const std::uint64_t R = static_cast<std::uint64_t>(sh_.buckets[bi]);
    std::uint64_t total = 1 << 20;
    for (int l = 0; l < sh_.layers; ++l) {
      const ds4::LayerConfig& c = cfg_[type_index(layer_ratio(l))];
      const std::uint64_t N = c.ratio > 1 ? static_cast<std::uint64_t>(c.max_model_len / c.ratio) : 0;
      const std::uint64_t M = N + static_cast<std::uint64_t>(std::min(c.window, c.max_model_len));
      total += align256(R * M * ds4::kHeadDim * 4) + align256(R * c.combined_width() * 4) + align256(R * 4) + 4 * 512;
      if (c.ratio == 4) total += align256(R * N * 4);  // the paged path's logits
    }
    return total;
  }
  void set_lengths(int bi, const std::vector<std::int32_t>& lens) override {
    for (int l = 0; l < sh_.layers; ++l) {
      ds4::DecodeProblem& p = problems_[l][bi];
      p.seq_lens = lens;
      if (p.cfg.ratio == 4 && path_ == DecodePath::gather)  // the paged path's indexer writes its own
        for (int b = 0; b < p.batch; ++b)
          make_picks(lens[b] / 4, p.cfg.topk, 31 + static_cast<std::uint64_t>(b), &p.topk_local[static_cast<std::size_t>(b) * p.cfg.topk]);
    }
  }
  void run_layers(int bi, const Bindings& b, bool graph) override {
    for (int l = 0; l < sh_.layers; ++l) {
      float* out = (graph ? out_graph_ : out_eager_)[l].data();
      if (path_ == DecodePath::gather)
        layer(problems_[l][bi], b, out);
      else
        paged_layer(problems_[l][bi], problems_[l][bi].cfg.ratio == 4 ? &ix_in_[l][bi] : nullptr, b, out);
    }
  }
  void poison(int, bool graph) override {
    for (auto& o : graph ? out_graph_ : out_eager_) std::memset(o.data(), kPoison, o.size() * sizeof(float));
  }
  std::uint64_t differing_bytes(int bi) override {
    std::uint64_t n = 0;
    const std::size_t bytes = bucket_elems(bi) * sizeof(float);
    for (int l = 0; l < sh_.layers; ++l) {
      const auto* a = reinterpret_cast<const std::uint8_t*>(out_graph_[l].data());
      const auto* e = reinterpret_cast<const std::uint8_t*>(out_eager_[l].data());
      for (std::size_t i = 0; i < bytes; ++i) n += a[i] != e[i];
    }
    return n;
  }
  bool graph_output_untouched(int bi) override {
    const std::size_t bytes = bucket_elems(bi) * sizeof(float);
    for (const auto& o : out_graph_) {
      const auto* a = reinterpret_cast<const std::uint8_t*>(o.data());
      for (std::size_t i = 0; i < bytes; ++i)
        if (a[i] != kPoison) return false;
    }
    return true;
  }
  void corrupt_graph_output() override { reinterpret_cast<std::uint8_t*>(out_graph_[0].data())[0] ^= 0x01; }
  std::optional<double> reference_error(int bi) override {
    double worst = 0;
    const std::size_t n = bucket_elems(bi);
    std::vector<float> r(n);
    for (int l = 0; l < sh_.layers; ++l) {
      ds4::ref::sparse_attention(problems_[l][bi], r.data());
      double num = 0, den = 0;
      for (std::size_t i = 0; i < n; ++i) {
        const double d = static_cast<double>(out_eager_[l][i]) - r[i];
        num += d * d;
        den += static_cast<double>(r[i]) * r[i];
      }
      worst = std::max(worst, den == 0 ? std::sqrt(num) : std::sqrt(num / den));
    }
    return worst;
  }
  void timer_start() override { t0_ = std::chrono::steady_clock::now(); }
  double timer_stop_ms() override {
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0_).count();
  }
  void synchronize() override {}
  std::string machine() const override { return "host (CPU reference path, no GPU)"; }
  bool is_host() const override { return true; }

 private:
  std::size_t bucket_elems(int bi) const {
    return static_cast<std::size_t>(sh_.buckets[bi]) * sh_.heads * ds4::kHeadDim;
  }
  // One layer: the same sizes as ds4::GatherDecode::run (fp32 workspace instead of bf16).
  void layer(ds4::DecodeProblem& p, const Bindings& b, float* out) {
    Arena& arena = *arena_;
    const ds4::LayerConfig& cfg = p.cfg;
    const int r = cfg.ratio;
    const Symbol W = syms_.window;
    const Extent n_c = r > 1 ? max_over(syms_.seq_lens, [&](const Extent& l) { return floor_div(l, r); }) : Extent(0);
    const Extent g = max_over(syms_.seq_lens, [&](const Extent& l) { return min(l, Extent(W)); });
    const StaticQueryBound swa_bound{Extent(W)};
    const std::int64_t N = arena.dimension(hs_, "ds4.kv.compressed_rows", n_c, ds4::compressed_rows_policy(sizing_), b);
    const std::int64_t G = arena.dimension(hs_, "ds4.kv.swa_rows", g, ds4::swa_rows_policy(sizing_, swa_bound), b);
    const std::int64_t M = N + G;
    const int width = cfg.combined_width();
    auto kv = arena.request(hs_, "ds4.kv", Extent(syms_.requests) * M * ds4::kHeadDim, sizeof(float), capacity_bound, b);
    auto idx = arena.request(hs_, "ds4.combined_indices", Extent(syms_.requests) * width, 4, capacity_bound, b);
    auto lens = arena.request(hs_, "ds4.combined_lens", Extent(syms_.requests), 4, capacity_bound, b);
    float* ws = kv.as<float>();
    std::int32_t* ip = idx.as<std::int32_t>();
    std::int32_t* lp = lens.as<std::int32_t>();
    const std::int64_t ws_rows = static_cast<std::int64_t>(p.batch) * M;
    ds4::DecodeProblem* pp = &p;
    hs_.launch([pp, N, M, width, ip, lp] { host_combine(*pp, N, M, width, ip, lp); });
    hs_.launch([pp, N, M, ws_rows, ws] { host_gather(*pp, N, M, ws_rows, ws); });
    hs_.launch([pp, ws, ws_rows, ip, lp, width, out] {
      ds4::ref::attention_over_workspace(*pp, ws, ws_rows, ip, lp, width, out);
    });
  }

  // One layer of the paged path, its requests in ds4::PagedDecode::run's order: the index lists, then
  // (C4) the indexer's logits, released before the attention (the host attention needs no split-K
  // partials).
  void paged_layer(ds4::DecodeProblem& p, const ds4::ref::IndexerInputs* in, const Bindings& b, float* out) {
    Arena& arena = *arena_;
    const ds4::LayerConfig& cfg = p.cfg;
    const Extent Rx(syms_.requests);
    ds4::DecodeProblem* pp = &p;
    const int cw = std::max(cfg.compressed_width(), 1);
    auto cmp_idx = arena.request(hs_, "ds4.paged.cmp_idx", Rx * cw, 4, capacity_bound, b);
    auto cmp_lens = arena.request(hs_, "ds4.paged.cmp_lens", Rx, 4, capacity_bound, b);
    auto swa_idx = arena.request(hs_, "ds4.paged.swa_idx", Rx * Extent(syms_.window), 4, capacity_bound, b);
    auto swa_lens = arena.request(hs_, "ds4.paged.swa_lens", Rx, 4, capacity_bound, b);
    const bool has_cmp = cfg.ratio > 1;
    std::int32_t* ci = has_cmp ? cmp_idx.as<std::int32_t>() : nullptr;
    std::int32_t* cl = cmp_lens.as<std::int32_t>();
    std::int32_t* si = swa_idx.as<std::int32_t>();
    std::int32_t* sl = swa_lens.as<std::int32_t>();
    if (in != nullptr) {
      const Extent rows = max_over(syms_.seq_lens, [](const Extent& l) { return floor_div(l, ds4::kIndexerRatio); });
      const std::int64_t N = arena.dimension(hs_, "ds4.indexer.rows", rows, ds4::compressed_rows_policy(sizing_), b);
      auto logits = arena.request(hs_, "ds4.indexer.logits", static_cast<std::int64_t>(p.batch) * N, sizeof(float),
                                  capacity_bound, b);
      float* lp = logits.as<float>();
      const std::int64_t logit_rows = static_cast<std::int64_t>(p.batch) * N;
      hs_.launch([pp, in, N, lp, logit_rows] { host_indexer(*pp, *in, N, lp, logit_rows); });
    }
    hs_.launch([pp, ci, cl, si, sl, out] {
      ds4::ref::combine_paged(*pp, ci, cl, si, sl);
      host_paged_attention(*pp, ci, cl, si, sl, out);
    });
  }

  Shapes sh_;
  const ds4::Ds4Symbols& syms_;
  HostBackend backend_;
  HostStream hs_;
  Arena* arena_ = nullptr;
  ds4::Sizing sizing_ = ds4::Sizing::safe;
  DecodePath path_ = DecodePath::paged;
  ds4::LayerConfig cfg_[3];
  std::vector<std::vector<ds4::DecodeProblem>> problems_;  // [layer][bucket]
  std::vector<std::vector<ds4::ref::IndexerInputs>> ix_in_;  // [layer][bucket], C4 layers
  std::vector<std::vector<float>> out_graph_, out_eager_;
  std::chrono::steady_clock::time_point t0_;
};

// ------------------------------------------------------------------------------------------------
// One policy's run

struct PolicyResult {
  std::string path, name, n_policy, g_policy;
  int steps_run = 0;
  bool stopped = false;  // --no-recapture: stopped at the refused replay
  double capture_ms = 0;
  double eager_ms = 0, graph_ms = 0;  // means per decode step (all layers)
  int eager_samples = 0, graph_samples = 0;
  double guard_ns = 0;                // plan().check per replay, mean over the buckets' graphs
  std::size_t guards = 0;             // live guards over all buckets' graphs
  std::size_t findings = 0;           // capture findings (plans)
  std::uint64_t region_bytes = 0, sum_plan_bytes = 0, largest_plan_bytes = 0;
  std::uint64_t peak_live_bytes = 0;  // lower bound on the region (workspaces live at once)
  std::uint64_t estimate_bytes = 0;   // graphsafe::estimate before any capture
  std::vector<std::uint64_t> plan_bytes;  // per bucket (ascending buckets)
  std::uint64_t recaptures = 0, refusals = 0;
  int checks = 0, failed = 0;
};

struct Policy {
  std::string name;
  ds4::Sizing sizing;
};

std::string first_lines(const std::string& s, int n, const char* indent) {
  std::istringstream in(s);
  std::string out, line;
  int i = 0;
  while (std::getline(in, line)) {
    if (i++ == n) {
      out += indent;
      out += "...\n";
      break;
    }
    out += indent + line + "\n";
  }
  return out;
}

PolicyResult run_policy(Engine& eng, const Shapes& sh, const Options& opt, const ds4::Ds4Symbols& syms,
                        const Policy& pol, DecodePath path) {
  PolicyResult res;
  res.path = path_name(path);
  res.name = pol.name;
  const bool paged = path == DecodePath::paged;
  int c4_layers = 0;
  for (int l = 0; l < sh.layers; ++l) c4_layers += layer_ratio(l) == 4;
  // What a graph freezes from the lengths: the gather path's N and G; the paged path's indexer
  // row stride N (C4 layers only: without one the paged path has no length-dependent size).
  const bool sized_by_lengths = !paged || c4_layers > 0;
  const bool exact = pol.sizing == ds4::Sizing::exact;
  const StaticQueryBound swa_bound{Extent(syms.window)};
  res.n_policy = std::string(ds4::compressed_rows_policy(pol.sizing).name());
  res.g_policy = paged ? std::string("-") : std::string(ds4::swa_rows_policy(pol.sizing, swa_bound).name());
  const bool unguarded = opt.inject == "unguarded";
  const bool recapture = exact && opt.recapture && opt.inject.empty();
  if (paged)
    std::printf("\n=== path paged, policy %s: N (the indexer's logits row stride) %s; index lists and scratch "
                "static%s\n",
                pol.name.c_str(), res.n_policy.c_str(),
                unguarded ? "; --inject-corruption: replays BYPASS the guard (replay_unguarded_for_testing)" : "");
  else
    std::printf("\n=== path gather, policy %s: N (compressed rows) %s, G (SWA rows) %s%s\n", pol.name.c_str(),
                res.n_policy.c_str(), res.g_policy.c_str(),
                unguarded ? "; --inject-corruption: replays BYPASS the guard (replay_unguarded_for_testing)" : "");

  const Stream s = eng.stream();
  const ds4::LayerConfig cfg = layer_config(sh, 4);
  Trace trace(sh, opt.seed, !opt.inject.empty());
  const int nb = static_cast<int>(sh.buckets.size());
  const std::int64_t granule = std::max(sh.window, sh.max_model_len / 16);
  debug::clear_findings();

  if (exact && opt.inject.empty() && sized_by_lengths) {
    // Debug mode (ArenaOptions::debug, what GRAPHSAFE_DEBUG=1 turns on) on one capture of the largest
    // bucket in an arena of its own: its capture-time report goes to stderr, its findings (kind,
    // request, site, fix) are listed below. Canaries off: this is about capture-time detection.
    ArenaOptions dao;
    dao.report_findings = false;
    dao.debug = true;
    dao.canaries = false;
    dao.nvtx = false;
    Arena debug_arena(eng.backend(), dao);
    eng.bind(debug_arena, pol.sizing, path);
    debug_arena.reserve(eng.capture_bytes_upper_bound(nb - 1), s);
    const int R = sh.buckets[nb - 1];
    const auto lens = trace.bucket_lens(R, R);
    eng.set_lengths(nb - 1, lens);
    std::printf("debug mode: capturing bucket %d once with ArenaOptions::debug (its report follows on stderr)\n", R);
    std::fflush(stdout);
    {
      auto probe = capture(debug_arena, s, syms.bind(R, cfg, lens),
                           [&eng, nb](const Bindings& bb) { eng.run_layers(nb - 1, bb, true); });
      eng.synchronize();
    }
    std::fflush(stderr);
    const auto dbg = debug::findings();
    std::printf("debug mode found %zu distinct problem(s) at capture time, before any replay, e.g.:\n", dbg.size());
    for (std::size_t i = 0; i < std::min<std::size_t>(2, dbg.size()); ++i) {
      const auto& f = dbg[i];
      std::printf("  FINDING [%s] %s (x%llu)\n    at %s\n    %s\n", f.kind.c_str(), f.request.c_str(),
                  static_cast<unsigned long long>(f.count), f.site.c_str(), f.message.c_str());
    }
    ++res.checks;
    if (dbg.empty()) {
      std::printf("  CHECK FAILED: debug mode should report exact-at-capture sizes at capture time\n");
      ++res.failed;
    }
  }

  ArenaOptions ao;
  ao.report_findings = false;  // printed below
  Arena arena(eng.backend(), ao);
  eng.bind(arena, pol.sizing, path);

  // ---- capture: one graph per bucket, largest first, one family --------------------------------
  CaptureFamily family = arena.family("decode");
  CaptureOptions family_only;
  family_only.family = family;
  // What the family will need, before any memory is taken (planning captures: nothing launches).
  // The captures below follow the placement it found.
  for (int bi = nb - 1; bi >= 0; --bi) {
    const int R = sh.buckets[bi];
    const CaptureEstimate e =
        estimate(arena, s, syms.bind(R, cfg, trace.bucket_lens(R, R)),
                 [&eng, bi](const Bindings& bb) { eng.run_layers(bi, bb, true); }, family_only);
    res.estimate_bytes = std::max(res.estimate_bytes, e.region_bytes);
  }
  // Re-captures at larger buckets (the exact policy) may need more than the estimate: keep room.
  arena.reserve(std::max(res.estimate_bytes, eng.capture_bytes_upper_bound(nb - 1)), s);
  std::vector<std::optional<CapturedGraph>> graphs(nb);
  std::vector<std::optional<Bindings>> last_ok(nb);
  for (int bi = nb - 1; bi >= 0; --bi) {
    const int R = sh.buckets[bi];
    const auto lens = trace.bucket_lens(R, R);
    eng.set_lengths(bi, lens);
    const Bindings b = syms.bind(R, cfg, lens);
    CaptureOptions co;
    co.family = family;
    if (recapture)
      co.recapture = [&syms, granule, &sh](const Bindings& refused) -> std::optional<Bindings> {
        std::vector<std::int64_t> up;
        for (auto v : refused.values(syms.seq_lens))
          up.push_back(std::min<std::int64_t>((v + granule / 2 + granule - 1) / granule * granule, sh.max_model_len));
        Bindings bucket = refused;
        bucket.set(syms.seq_lens, std::span<const std::int64_t>(up));
        return bucket;
      };
    const auto t0 = std::chrono::steady_clock::now();
    graphs[bi] = capture(arena, s, b, [&eng, bi](const Bindings& bb) { eng.run_layers(bi, bb, true); }, co);
    res.capture_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    last_ok[bi] = b;
    res.findings += graphs[bi]->plan().findings().size();
  }
  std::printf("captured %d graphs (buckets", nb);
  for (int R : sh.buckets) std::printf(" %d", R);
  std::printf(") x %d layers in %.1f ms, one family '%s': region %s (lower bound %s, estimate %s; separate regions: %s)\n",
              sh.layers, res.capture_ms, family.name().c_str(), show_bytes(static_cast<double>(family.region_bytes())).c_str(),
              show_bytes(static_cast<double>(family.peak_live_bytes())).c_str(),
              show_bytes(static_cast<double>(res.estimate_bytes)).c_str(),
              show_bytes(static_cast<double>(family.sum_of_plan_bytes())).c_str());
  ++res.checks;
  if (family.region_bytes() == res.estimate_bytes) {
    std::printf("  check: the estimate made before capturing equals the region: OK\n");
  } else {
    std::printf("  CHECK FAILED: estimate %llu bytes, region %llu bytes\n",
                static_cast<unsigned long long>(res.estimate_bytes),
                static_cast<unsigned long long>(family.region_bytes()));
    ++res.failed;
  }
  std::size_t guards = 0;
  for (auto& g : graphs) guards += g->plan().guard_count();
  if (!exact || !sized_by_lengths) {
    ++res.checks;
    if (res.findings == 0 && guards == 0) {
      std::printf("  check: no capture finding, no live guard (every size proven replay-safe): OK\n");
    } else {
      std::printf("  CHECK FAILED: a safe policy left %zu findings and %zu live guards\n", res.findings, guards);
      ++res.failed;
    }
  } else {
    ++res.checks;
    if (res.findings == 0) {
      std::printf("  CHECK FAILED: exact-at-capture on seq_lens should be reported at capture\n");
      ++res.failed;
    } else {
      const auto& f = graphs[nb - 1]->plan().findings().front();
      std::printf("capture findings in the plans: %zu over %d graphs (%zu live guards), e.g. %s at %s\n", res.findings,
                  nb, guards, f.request.c_str(), f.site.c_str());
    }
  }

  // ---- decode the growth trace -----------------------------------------------------------------
  bool told_refusal = false;
  for (int step = 0; step < sh.steps; ++step) {
    const int n = trace.active(step);
    const int bi = bucket_index(sh, n);
    const int R = sh.buckets[bi];
    const auto lens = trace.bucket_lens(n, R);
    eng.set_lengths(bi, lens);
    const Bindings b = syms.bind(R, cfg, lens);
    CapturedGraph& graph = *graphs[bi];
    const bool check = !opt.inject.empty() || step % sh.check_every == 0 || step == sh.steps - 1;

    // Eager: the truth for this step (sizes recomputed from the current lengths).
    double eager_ms = -1;
    if (check) {
      eng.poison(bi, false);
      eng.timer_start();
      eng.run_layers(bi, b, false);
      eager_ms = eng.timer_stop_ms();
      res.eager_ms += eager_ms;
      ++res.eager_samples;
    }
    const std::vector<GuardViolation> violations = exact ? graph.plan().check(b) : std::vector<GuardViolation>{};
    if (check || !violations.empty()) eng.poison(bi, true);
    if (!violations.empty() && !unguarded && !told_refusal) {
      told_refusal = true;
      const auto& v = violations.front();
      std::printf("step %d: batch %d (bucket %d), lengths grew past the capture: the guard checks %s\n", step, n, R,
                  v.symbols.c_str());
      std::printf("  %s needs %lld but the graph froze %lld (%s at %s): %s. %zu guard(s) fail.\n", v.request.c_str(),
                  static_cast<long long>(v.required), static_cast<long long>(v.reserved), v.policy.c_str(),
                  v.site.c_str(),
                  paged ? "the indexer would score only the first N rows of a request,\n  a wrong top-k"
                        : "the gather would write rows past N,\n  over the SWA rows of the workspace "
                          "(see --inject-corruption)",
                  violations.size());
    }
    const std::uint64_t recaptures_before = graph.recaptures();
    bool refused = false;
    std::string refusal;
    eng.timer_start();
    try {
      if (unguarded)
        graph.replay_unguarded_for_testing(s);
      else
        graph.replay(b, s);
    } catch (const guard_failure& e) {
      refused = true;
      refusal = e.what();
    }
    const double graph_ms = eng.timer_stop_ms();
    const bool recaptured = graph.recaptures() != recaptures_before;
    if (refused || !violations.empty()) ++res.refusals;
    res.recaptures += graph.recaptures() - recaptures_before;
    res.steps_run = step + 1;

    if (refused) {
      ++res.checks;
      const bool untouched = eng.graph_output_untouched(bi);
      std::printf("  replay REFUSED by the guard before launch:\n%s", first_lines(refusal, 4, "    ").c_str());
      if (!exact) {
        std::printf("  CHECK FAILED: a safe policy's replay was refused\n");
        ++res.failed;
      } else if (!untouched) {
        std::printf("  CHECK FAILED: the refused replay wrote output\n");
        ++res.failed;
      } else {
        std::printf("  check: the graph never ran (outputs untouched): OK. Without a re-capture hook this is\n"
                    "  where an engine must fall back (--no-recapture): decoding stops for this policy.\n");
      }
      res.stopped = true;
      break;
    }
    if (recaptured) {
      std::printf("  step %d: recapture hook: re-captured bucket %d at lengths rounded up to a multiple of %lld "
                  "(%llu re-captures so far), then replayed\n",
                  step, R, static_cast<long long>(granule), static_cast<unsigned long long>(res.recaptures));
    } else {
      res.graph_ms += graph_ms;
      ++res.graph_samples;
      if (violations.empty()) last_ok[bi] = b;
    }
    if (check) {
      if (opt.inject == "flip") eng.corrupt_graph_output();
      ++res.checks;
      const std::uint64_t diff = eng.differing_bytes(bi);
      int maxlen = 0;
      for (int v : lens) maxlen = std::max(maxlen, v);
      std::printf("  step %3d/%d  batch %2d (bucket %2d)  longest %6d  eager %8.3f ms  graph %8.3f ms  ", step + 1,
                  sh.steps, n, R, maxlen, eager_ms, graph_ms);
      if (diff == 0) {
        std::printf("replay == eager, %d layers bit for bit: OK\n", sh.layers);
      } else {
        std::printf("\n  CHECK FAILED: replay differs from eager in %llu bytes\n", static_cast<unsigned long long>(diff));
        ++res.failed;
      }
      if (const auto err = eng.reference_error(bi)) {
        ++res.checks;
        if (*err <= 1e-4) {
          std::printf("               eager vs independent CPU reference (ref::sparse_attention): rel. error %.1e: OK\n", *err);
        } else {
          std::printf("  CHECK FAILED: eager vs ref::sparse_attention relative error %.3e > 1e-4\n", *err);
          ++res.failed;
        }
      }
    }
    trace.advance(n);
  }
  if (exact && opt.inject.empty() && sized_by_lengths) {
    ++res.checks;
    if (res.refusals + res.recaptures == 0) {
      std::printf("  CHECK FAILED: the lengths grew past the capture but no guard fired\n");
      ++res.failed;
    }
  }

  // ---- guard cost and memory -------------------------------------------------------------------
  double ns = 0;
  int timed = 0;
  for (int bi = 0; bi < nb; ++bi) {
    res.guards += graphs[bi]->plan().guard_count();
    res.plan_bytes.push_back(graphs[bi]->reserved_bytes());
    if (!last_ok[bi] || !graphs[bi]->plan().check(*last_ok[bi]).empty()) continue;
    constexpr int kIters = 2000;
    std::size_t sink = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kIters; ++i) sink += graphs[bi]->plan().check(*last_ok[bi]).size();
    ns += std::chrono::duration<double, std::nano>(std::chrono::steady_clock::now() - t0).count() / kIters;
    ++timed;
    if (sink) std::printf("(unexpected guard violations while timing)\n");
  }
  res.guard_ns = timed ? ns / timed : 0;
  res.region_bytes = family.region_bytes();
  res.sum_plan_bytes = family.sum_of_plan_bytes();
  res.largest_plan_bytes = family.largest_plan_bytes();
  res.peak_live_bytes = family.peak_live_bytes();
  if (res.eager_samples) res.eager_ms /= res.eager_samples;
  if (res.graph_samples) res.graph_ms /= res.graph_samples;
  eng.synchronize();
  graphs.clear();
  return res;
}

// ------------------------------------------------------------------------------------------------

void print_summary(const std::vector<PolicyResult>& rs, const Shapes& sh, const std::string& machine,
                   std::optional<double> torch_pool_bytes) {
  std::printf("\n=== summary: %d layers, heads %d, batch buckets", sh.layers, sh.heads);
  for (int R : sh.buckets) std::printf(" %d", R);
  std::printf(", max_model_len %d, %d steps, on %s\n", sh.max_model_len, sh.steps, machine.c_str());
  std::printf("%-7s %-13s %-37s %10s %10s %8s %11s %11s %11s %11s %12s %11s %9s %7s\n", "path", "policy", "N / G sizing", "eager ms",
              "graph ms", "speedup", "guard ns", "region", "peak live", "estimate", "sep. regions", "saved", "recapture",
              "checks");
  for (const auto& r : rs) {
    char sizing[64], guard[32], rec[32], checks[32], speed[16];
    std::snprintf(sizing, sizeof sizing, "%s / %s", r.n_policy.c_str(), r.g_policy.c_str());
    std::snprintf(guard, sizeof guard, "%.0f (%zu)", r.guard_ns, r.guards);
    std::snprintf(rec, sizeof rec, "%llu/%llu", static_cast<unsigned long long>(r.recaptures),
                  static_cast<unsigned long long>(r.refusals));
    std::snprintf(checks, sizeof checks, "%d/%d", r.checks - r.failed, r.checks);
    if (r.graph_samples && r.eager_samples && r.graph_ms > 0)
      std::snprintf(speed, sizeof speed, "%.2fx", r.eager_ms / r.graph_ms);
    else
      std::snprintf(speed, sizeof speed, "-");
    std::printf("%-7s %-13s %-37s %10.3f %10.3f %8s %11s %11s %11s %11s %12s %11s %9s %7s%s\n", r.path.c_str(),
                r.name.c_str(), sizing,
                r.eager_ms, r.graph_ms, speed, guard, show_bytes(static_cast<double>(r.region_bytes)).c_str(),
                show_bytes(static_cast<double>(r.peak_live_bytes)).c_str(),
                show_bytes(static_cast<double>(r.estimate_bytes)).c_str(),
                show_bytes(static_cast<double>(r.sum_plan_bytes)).c_str(),
                show_bytes(static_cast<double>(r.sum_plan_bytes > r.region_bytes ? r.sum_plan_bytes - r.region_bytes : 0))
                    .c_str(),
                rec, checks,
                r.stopped ? "  (stopped at the refusal)" : "");
  }
  std::printf("columns: path = paged (C4: indexer + paged-direct attention) or gather (gather to a workspace);\n"
              "N / G sizing = the policies of the sizes a graph freezes (paged: the indexer's row stride N only);\n"
              "eager/graph ms = mean time of one decode step (all layers); guard ns = plan guard check per\n"
              "replay (live guards); region = the family's shared workspace region; peak live = its lower bound (bytes\n"
              "of workspaces live at once); estimate = graphsafe::estimate before capturing; sep. regions = what one\n"
              "region per bucket graph would hold; recapture = re-captures / replays whose guards failed; checks =\n"
              "passed / run.\n");
  // The PyTorch figure is measured on capture_memory_bench's pattern, which is the gather path's
  // workspaces; the paged path allocates different (much smaller) ones, so it gets no such ratio.
  if (torch_pool_bytes)
    for (const auto& r : rs)
      if (r.path == "gather")
        std::printf(
            "  %s %s: region %s = %.3fx PyTorch's graph pool on the same pattern (%s, bench/torch_capture_pool.py)\n",
            r.path.c_str(), r.name.c_str(), show_bytes(static_cast<double>(r.region_bytes)).c_str(),
            static_cast<double>(r.region_bytes) / *torch_pool_bytes, show_bytes(*torch_pool_bytes).c_str());
}

void write_json(const std::string& path, const std::vector<PolicyResult>& rs, const Shapes& sh, const std::string& machine,
                const std::string& command, std::optional<double> torch_pool_bytes) {
  const std::string tag = "L" + std::to_string(sh.layers) + "_H" + std::to_string(sh.heads) + "_B" +
                          std::to_string(sh.batch) + "_len" + std::to_string(sh.max_model_len);
  nlohmann::ordered_json records = nlohmann::ordered_json::array();
  // ratio = baseline / value, null without a baseline.
  auto rec = [&](const std::string& name, double value, const char* unit, const std::string& bname,
                 std::optional<double> bval) {
    nlohmann::ordered_json r = {{"name", name}, {"value", value}, {"unit", unit}, {"baseline_name", nullptr},
                        {"baseline_value", nullptr}, {"ratio", nullptr}, {"machine", machine}, {"command", command}};
    if (bval) {
      r["baseline_name"] = bname;
      r["baseline_value"] = *bval;
      if (value != 0) r["ratio"] = *bval / value;
    }
    records.push_back(std::move(r));
  };
  for (const auto& r : rs) {
    const std::string p = "ds4_decode_demo." + tag + "_" + r.path + "." + r.name + ".";
    if (r.graph_samples)
      rec(p + "graph_step_ms", r.graph_ms, "ms", p + "eager_step_ms",
          r.eager_samples ? std::optional<double>(r.eager_ms) : std::nullopt);
    if (r.eager_samples) rec(p + "eager_step_ms", r.eager_ms, "ms", "", std::nullopt);
    rec(p + "guard_check_ns_per_replay", r.guard_ns, "ns", "", std::nullopt);
    rec(p + "live_guards", static_cast<double>(r.guards), "count", "", std::nullopt);
    const std::string sep = p + "separate_regions_bytes";
    rec(p + "family_region_bytes", static_cast<double>(r.region_bytes), "B", sep,
        static_cast<double>(r.sum_plan_bytes));
    rec(sep, static_cast<double>(r.sum_plan_bytes), "B", "", std::nullopt);
    const std::string peak = p + "region_peak_live_bytes";
    rec(p + "region_over_peak_live", r.peak_live_bytes ? static_cast<double>(r.region_bytes) / r.peak_live_bytes : 0, "x",
        "", std::nullopt);
    rec(peak, static_cast<double>(r.peak_live_bytes), "B", "", std::nullopt);
    if (torch_pool_bytes && r.path == "gather")  // measured on this path's pattern only (see print_summary)
      rec(p + "region_bytes_vs_torch_graph_pool", static_cast<double>(r.region_bytes), "B",
          "torch.cuda.graph_pool.reserved_bytes", *torch_pool_bytes);
    rec(p + "region_estimate_bytes", static_cast<double>(r.estimate_bytes), "B", (p + "family_region_bytes").c_str(),
        static_cast<double>(r.region_bytes));
    for (std::size_t i = 0; i < r.plan_bytes.size(); ++i)
      rec(p + "plan_bytes_bucket" + std::to_string(sh.buckets[i]), static_cast<double>(r.plan_bytes[i]), "B", "",
          std::nullopt);
    rec(p + "capture_ms", r.capture_ms, "ms", "", std::nullopt);
    rec(p + "recaptures", static_cast<double>(r.recaptures), "count", "", std::nullopt);
    rec(p + "refusals", static_cast<double>(r.refusals), "count", "", std::nullopt);
    rec(p + "checks_passed", static_cast<double>(r.checks - r.failed), "count", p + "checks_run",
        static_cast<double>(r.checks));
  }
  std::ofstream f(path);
  if (!f) throw std::runtime_error("ds4_decode_demo: cannot write " + path);
  f << records.dump(2) << "\n";
  if (!f) throw std::runtime_error("ds4_decode_demo: error writing " + path);
}

}  // namespace

int main(int argc, char** argv) {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // progress lines show as they happen, in order with stderr
  int exit_code = 0;
  auto parsed = parse(argc, argv, exit_code);
  if (!parsed) return exit_code;
  Options opt = *parsed;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  const bool gpu = err == cudaSuccess && count > 0 && !opt.force_host;
  try {
    std::string machine;
    if (gpu) {
      int id = 0;
      cudaDeviceProp prop{};
      GRAPHSAFE_CUDA(cudaGetDevice(&id));
      GRAPHSAFE_CUDA(cudaGetDeviceProperties(&prop, id));
      machine = std::string(prop.name) + ", " + std::to_string(prop.multiProcessorCount) + " SMs";
      std::printf("graphsafe ds4_decode_demo: CUDA device %d (%s, sm_%d%d, %d SMs) -- CUDA backend: real CUDA Graphs "
                  "over the DS4 kernels\n",
                  id, prop.name, prop.major, prop.minor, prop.multiProcessorCount);
    } else {
      machine = "host (CPU reference path, no GPU)";
      if (count > 0)
        std::printf("graphsafe ds4_decode_demo: --host given (%d CUDA device(s) present) -- host backend: the CPU "
                    "reference path on tiny shapes\n",
                    count);
      else
        std::printf("graphsafe ds4_decode_demo: no CUDA device (cudaGetDeviceCount: %s) -- host backend: the CPU "
                    "reference path on tiny shapes\n",
                    err == cudaSuccess ? "0 devices" : cudaGetErrorString(err));
    }
    Shapes sh;
    if (!gpu) {
      sh.heads = 4;
      sh.batch = 4;
      sh.max_model_len = 512;
      sh.steps = 16;
      sh.check_every = 4;
      sh.window = 4;
      sh.topk = 8;
      sh.swa_block_tokens = 16;
    }
    sh.layers = opt.layers.value_or(sh.layers);
    sh.heads = opt.heads.value_or(sh.heads);
    sh.batch = opt.batch.value_or(sh.batch);
    sh.max_model_len = opt.max_model_len.value_or(sh.max_model_len);
    sh.steps = opt.steps.value_or(sh.steps);
    sh.check_every = opt.check_every.value_or(sh.check_every);
    if (!check_inputs(sh, opt, gpu)) return 2;
    for (int R = std::max(1, sh.batch / 8); R < sh.batch; R *= 2) sh.buckets.push_back(R);
    sh.buckets.push_back(sh.batch);

    std::vector<Policy> policies;
    if (opt.inject == "unguarded") {
      policies = {{"exact", ds4::Sizing::exact}};
    } else {
      if (opt.policy == "all" || opt.policy == "capacity") policies.push_back({"capacity", ds4::Sizing::capacity});
      if (opt.policy == "all" || opt.policy == "static-query") policies.push_back({"static-query", ds4::Sizing::safe});
      if (opt.policy == "all" || opt.policy == "exact") policies.push_back({"exact", ds4::Sizing::exact});
      if (opt.inject == "flip") policies.resize(1);
    }

    const ds4::Ds4Symbols syms(layer_config(sh, 4));
    int types[3] = {0, 0, 0};
    for (int l = 0; l < sh.layers; ++l) ++types[type_index(layer_ratio(l))];
    std::printf("model: %d attention layers (%d %s, %d %s, %d %s; V4-Flash schedule), H %d, W %d, K %d, "
                "max_model_len %d\n",
                sh.layers, types[0], type_name(0), types[1], type_name(1), types[2], type_name(2), sh.heads, sh.window,
                sh.topk, sh.max_model_len);
    std::printf("trace: %d slots, prompts of mixed lengths, %d decode steps (+1 token per active request), active "
                "batch varies over buckets",
                sh.batch, sh.steps);
    for (int R : sh.buckets) std::printf(" %d", R);
    std::printf("; eager vs replay checked every %d steps\n", sh.check_every);
    std::printf("path: %s\n", opt.inject == "unguarded" ? "gather (--inject-corruption=unguarded)"
                               : opt.path == "paged" ? "paged (C4 layers: indexer scores + top-k, then paged-direct attention)"
                               : opt.path == "gather" ? "gather (gather to a bf16 workspace, then attention)"
                                                      : "paged, then gather");
    std::printf("caches: one SWA cache for all layers, one compressed cache per layer type (shared: see docs/ds4_client.md); "
                "per-layer queries, sinks, outputs and workspaces\n");

    const auto t0 = std::chrono::steady_clock::now();
    std::unique_ptr<Engine> eng;
    if (gpu)
      eng = std::make_unique<CudaEngine>(sh, syms, opt.seed, machine);
    else
      eng = std::make_unique<HostEngine>(sh, syms, opt.seed);
    std::printf("inputs built in %.2f s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());

    std::vector<PolicyResult> results;
    std::vector<DecodePath> paths;
    if (opt.inject == "unguarded") {
      paths = {DecodePath::gather};  // the overwrite the comparison with eager must catch
    } else {
      if (opt.path != "gather") paths.push_back(DecodePath::paged);
      if (opt.path != "paged") paths.push_back(DecodePath::gather);
    }
    for (const DecodePath path : paths)
      for (const auto& p : policies) results.push_back(run_policy(*eng, sh, opt, syms, p, path));
    print_summary(results, sh, eng->machine(), opt.torch_pool_bytes);
    if (!opt.json.empty()) {
      write_json(opt.json, results, sh, eng->machine(), opt.command, opt.torch_pool_bytes);
      std::printf("figures written to %s\n", opt.json.c_str());
    }
    int failed = 0, checks = 0;
    for (const auto& r : results) {
      failed += r.failed;
      checks += r.checks;
    }
    eng.reset();
    if (failed == 0)
      std::printf("result: all %d checks passed\n", checks);
    else
      std::printf("result: %d of %d CHECKS FAILED\n", failed, checks);
    return failed == 0 ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ds4_decode_demo: error: %s\n", e.what());
    std::printf("result: CHECKS FAILED (error)\n");
    return 1;
  }
}
