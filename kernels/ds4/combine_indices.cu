// Index construction for the two attention paths (docs/ds4_model.md §4.2 step 8 and §7.1). One CTA per request;
// exact integer twins of ref::combine_paged and ref::combine_gather (strided gather layout) /
// ref::combine_gather_ragged (ragged). Lengths come from DEVICE seq_lens; widths, N and M are launch
// arguments.
#include <graphsafe/ds4/kernels.hpp>

#include "cuda_support.cuh"
#include "paged_index.cuh"
#include "ragged_rows.cuh"

#include <climits>

namespace graphsafe::ds4::cuda {
namespace {

using namespace detail;

// One CTA per query row r = b * query_tokens + t (the lists are per query row, the lengths and
// block tables per request): token t of a request of length L_b sits at position L_b - s_q + t and
// attends like a one-token request of length L_b - s_q + 1 + t (0 below position 0 and for L_b == 0).
__global__ void __launch_bounds__(256) combine_paged_kernel(const PagedIndexArgs a) {
  const int row = blockIdx.x;
  const int b = row / a.query_tokens;
  const int L_req = max(a.seq_lens[b], 0);
  const int L = L_req > 0 ? max(L_req - a.query_tokens + 1 + row % a.query_tokens, 0) : 0;
  const int n_c = a.ratio > 1 ? L / a.ratio : 0;
  const int topk_len = a.ratio == 4 ? min(n_c, a.topk) : (a.ratio > 1 ? min(n_c, a.cmp_width) : 0);
  if (a.cmp_idx != nullptr) {
    for (int i = threadIdx.x; i < a.cmp_width; i += blockDim.x) {
      int v = -1;
      if (i < topk_len) {
        const int c = a.ratio == 4 ? a.topk_local[static_cast<long long>(row) * a.topk + i] : i;
        if (c >= 0) v = paged_cmp_slot(a, b, c);
      }
      a.cmp_idx[static_cast<long long>(row) * a.cmp_width + i] = v;
    }
    if (threadIdx.x == 0) a.cmp_lens[row] = topk_len;
  }
  write_swa_list(a, row, b, L);
}

constexpr int kCombineGatherThreads = 256;

__global__ void __launch_bounds__(kCombineGatherThreads) combine_gather_kernel(const GatherIndexArgs a) {
  const int b = blockIdx.x;
  const int L = max(a.seq_lens[b], 0);
  const int n_c = a.ratio > 1 ? L / a.ratio : 0;
  const int topk_len = a.ratio > 1 ? min(n_c, a.topk) : 0;
  const int swa = min(L, a.window);
  // The rows gather_workspace wrote (kernels.hpp): strided at b*M (SWA at + N), ragged at row0(b)
  // (SWA right after the n_c compressed rows). a.ragged is uniform: the whole CTA takes the branch.
  const long long row0 = a.ragged ? ragged_row0<kCombineGatherThreads>(a.seq_lens, b, a.ratio, a.window)
                                  : static_cast<long long>(b) * a.M;
  const long long swa_row = a.ragged ? n_c : a.N;
  for (int i = threadIdx.x; i < a.width; i += blockDim.x) {
    long long v = -1;
    if (i < topk_len) {
      const int c = a.ratio == 4 ? a.topk_local[static_cast<long long>(b) * a.topk + i] : i;
      v = row0 + c;
    } else if (i < topk_len + swa) {
      v = row0 + swa_row + (i - topk_len);
    }
    a.idx[static_cast<long long>(b) * a.width + i] = static_cast<std::int32_t>(v);
  }
  if (threadIdx.x == 0) a.lens[b] = topk_len + swa;
}

}  // namespace

void combine_paged(const PagedIndexArgs& a, cudaStream_t stream) {
  const char* fn = "combine_paged";
  check_paged_index_args(fn, a);
  PagedIndexArgs k = a;
  if (a.ratio == 1) k.cmp_idx = nullptr;
  combine_paged_kernel<<<a.batch * a.query_tokens, 256, 0, stream>>>(k);
  check_launch(fn);
}

void combine_gather(const GatherIndexArgs& a, cudaStream_t stream) {
  const char* fn = "combine_gather";
  require_batch(fn, a.batch);
  require_ratio(fn, a.ratio);
  require_ptr(fn, "seq_lens", a.seq_lens);
  require_ptr(fn, "idx", a.idx);
  require_ptr(fn, "lens", a.lens);
  if (a.ratio == 4) require_ptr(fn, "topk_local", a.topk_local);
  if (a.width <= 0) bad_arg(fn, "width", a.width, ">= 1");
  if (a.N < 0 || a.M < a.N) bad_arg(fn, "M - N", a.M - a.N, ">= 0 with N >= 0");
  // Both layouts: the ragged rows lie below B*M when the sizes hold the problem (kernels.hpp).
  if (static_cast<long long>(a.batch) * a.M > INT_MAX)
    bad_arg(fn, "B*M", static_cast<long long>(a.batch) * a.M, "<= 2^31-1 (int32 indices)");
  combine_gather_kernel<<<a.batch, kCombineGatherThreads, 0, stream>>>(a);
  check_launch(fn);
}

}  // namespace graphsafe::ds4::cuda
