// DS4 sparse decode attention with per-head sinks (docs/ds4_model.md §2.5, §7.1): the host entry points.
//
// Algorithm. For request b and head h with query q (512 dims) and the request's attended rows K
// (its compressed entries, then its sliding-window tokens; V = K, all 512 dims):
//     out = sum_i softmax_i(q . K_i * scale) K_i, the softmax's denominator including exp(sink[h]).
// One CTA = (split, request b, group of 64 heads) keeps the 64 heads' queries in shared memory and
// streams the request's rows in tiles of 64, computing per tile S = Q K^T (64 x 64, k = 512), an
// online softmax per head (base-2 exponentials, running max m and sum l) and O += P V (64 x 512,
// k = 64); bf16 operands, fp32 accumulation, bf16 P. Split-K (flash-decoding): a request's tiles are
// split evenly over `splits` CTAs so that a small batch still fills the GPU; the splits merge in
// split order, so results are deterministic run to run.
//
// Row sources: paged-direct reads each row's 576 data bytes + 8 scale bytes from the fp8 paged
// caches and dequantizes them into bf16 (exact: e4m3 * 2^k fits bf16); the workspace path copies
// bf16 rows from the gather workspace. Both feed the same tile computation, so for the same rows in
// the same order they produce bitwise identical output.
//
// Engines (AttentionOptions, kernels.hpp), in attention/:
//   ws_kernel.cuh        warp-specialized (sm_90a): a producer warpgroup (producer.cuh) gathers
//                        and dequantizes rows into a double-buffered bf16 K tile, a math and a PV
//                        warpgroup run S, the softmax and PV on wgmma; merge.cuh: the splits merge
//                        in a thread-block cluster;
//   mma_sync_kernel.cuh  portable mma.sync engine (any sm_80+ GPU);
//   combine.cu           the merge through the scratch for other split counts;
//   config.cuh           tile shapes, shared-memory plans, named barriers; params.cuh the launch
//                        arguments; launch.cuh the launch; instantiations/ one TU per row source;
//   probe.cuh            the instrumentation policy (timeline.cuh: the benchmark's timeline build).

#include "attention/config.cuh"
#include "attention/params.cuh"
#include "attention/probe.cuh"

#include <algorithm>
#include <cmath>

namespace graphsafe::ds4::cuda {
namespace {

using namespace detail;
using attention::kGroupHeads;
using attention::kLog2e;
using attention::kTileRows;

void check_common(const char* fn, const AttentionCommon& c) {
  require_batch(fn, c.batch);
  require_heads(fn, c.heads);
  require_ptr(fn, "q", c.q);
  require_ptr(fn, "out", c.out);
  if (c.splits < 1 || c.splits > 1024) bad_arg(fn, "splits", c.splits, "1 .. 1024");
  if (c.splits > 1) require_ptr(fn, "scratch (splits > 1)", c.scratch);
  if (!(c.scale > 0.f) || !std::isfinite(c.scale)) bad_arg(fn, "scale (x1e6)", static_cast<long long>(c.scale * 1e6), "a finite positive value (512^-0.5)");
}

attention::Params common_params(const AttentionCommon& c) {
  attention::Params kp{};
  kp.B = c.batch;
  kp.H = c.heads;
  kp.splits = c.splits;
  kp.scale_log2 = c.scale * kLog2e;
  kp.q = c.q;
  kp.sink = c.sink;
  kp.out = c.out;
  kp.part_o = static_cast<float*>(c.scratch);
  kp.part_ml = c.scratch_ml != nullptr ? static_cast<float*>(c.scratch_ml)
               : c.scratch != nullptr
                   ? static_cast<float*>(c.scratch) + static_cast<std::size_t>(c.batch) * c.splits * c.heads * kHeadDim
                   : nullptr;
  return kp;
}

}  // namespace

int device_sm_count() {
  static int cached[64] = {};
  int dev = 0;
  detail::check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  int& v = cached[dev & 63];
  if (v == 0) {
    int n = 0;
    detail::check_cuda(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev),
                       "cudaDeviceGetAttribute(MultiProcessorCount)");
    v = n;
  }
  return v;
}

int choose_splits(int batch, int heads, int max_rows_per_request, int num_sms) {
  detail::require_batch("choose_splits", batch);
  detail::require_heads("choose_splits", heads);
  const int ctas = batch * (heads / kGroupHeads);
  const int tiles = std::max(1, (max_rows_per_request + kTileRows - 1) / kTileRows);
  int s = std::max(1, num_sms / ctas);
  return std::min(s, tiles);
}

std::size_t sparse_attention_scratch_bytes(int batch, int heads, int splits) {
  if (splits <= 1) return 0;
  return static_cast<std::size_t>(batch) * splits * heads * (kHeadDim + 2) * sizeof(float);
}

namespace attention {

Params paged_params(const PagedAttentionArgs& a) {
  const char* fn = "sparse_attention_paged";
  check_common(fn, a.c);
  require_cache(fn, "swa", a.swa);
  require_ptr(fn, "swa_idx", a.swa_idx);
  require_ptr(fn, "swa_lens", a.swa_lens);
  if (a.swa_width < 0) bad_arg(fn, "swa_width", a.swa_width, ">= 0");
  Params kp = common_params(a.c);
  kp.swa = view_of(a.swa);
  kp.swa_idx = a.swa_idx;
  kp.swa_lens = a.swa_lens;
  kp.swa_width = a.swa_width;
  if (a.cmp_idx != nullptr) {
    require_cache(fn, "cmp", a.cmp);
    require_ptr(fn, "cmp_lens", a.cmp_lens);
    if (a.cmp_width < 0) bad_arg(fn, "cmp_width", a.cmp_width, ">= 0");
    kp.cmp = view_of(a.cmp);
    kp.cmp_idx = a.cmp_idx;
    kp.cmp_lens = a.cmp_lens;
    kp.cmp_width = a.cmp_width;
  } else {
    kp.cmp = kp.swa;
  }
  return kp;
}

Params workspace_params(const WorkspaceAttentionArgs& a) {
  const char* fn = "sparse_attention_workspace";
  check_common(fn, a.c);
  require_ptr(fn, "ws", a.ws);
  require_ptr(fn, "idx", a.idx);
  require_ptr(fn, "lens", a.lens);
  if (a.width < 0) bad_arg(fn, "width", a.width, ">= 0");
  if (a.ws_rows < 0) bad_arg(fn, "ws_rows", a.ws_rows, ">= 0");
  if (reinterpret_cast<std::uintptr_t>(a.ws) % 16 != 0) bad_arg(fn, "ws % 16", static_cast<long long>(reinterpret_cast<std::uintptr_t>(a.ws) % 16), "0");
  Params kp = common_params(a.c);
  kp.ws = a.ws;
  kp.ws_rows = a.ws_rows;
  kp.idx = a.idx;
  kp.lens = a.lens;
  kp.width = a.width;
  return kp;
}

bool& cluster_refused() {
  static bool v = false;
  return v;
}

int device_cc_major() {
  static int major[64] = {};
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  int& m = major[dev & 63];
  if (m == 0)
    check_cuda(cudaDeviceGetAttribute(&m, cudaDevAttrComputeCapabilityMajor, dev),
               "cudaDeviceGetAttribute(ComputeCapabilityMajor)");
  return m;
}

}  // namespace attention

void sparse_attention_paged(const PagedAttentionArgs& a, cudaStream_t stream, const AttentionOptions& options) {
  attention::Params p = attention::paged_params(a);
  attention::run<true, attention::NoProbe>(p, a.c, options, stream, "sparse_attention_kernel<paged>");
}

void sparse_attention_workspace(const WorkspaceAttentionArgs& a, cudaStream_t stream, const AttentionOptions& options) {
  attention::Params p = attention::workspace_params(a);
  attention::run<false, attention::NoProbe>(p, a.c, options, stream, "sparse_attention_kernel<workspace>");
}

}  // namespace graphsafe::ds4::cuda
