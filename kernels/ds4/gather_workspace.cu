// Gather-to-workspace (docs/ds4_model.md §4.2 steps 5-6): dequantize every visible compressed row and the SWA
// window of each request into the bf16 workspace [B*M, 512]. One warp per row, grid-stride over the
// request's rows (the grid is static; n_c and swa_len come from device seq_lens). Two launches:
// compressed rows, then SWA rows, like the seed.
//
// Two layouts (kernels.hpp): strided (request b at row b*M, its SWA rows at b*M + N: the seed's) and
// ragged (request b at row0(b) = sum_{j<b} rows(j), computed per CTA from device seq_lens, its SWA
// rows right after its n_c compressed rows), so that the rows written are one prefix of the
// workspace (what a virtual-growth arena maps).
//
// NO BOUND CHECK against N or M, on purpose: this is the seed bug's kernel shape. If the caller's N is
// below n_c, SWA rows land on compressed rows >= N; if swa_len > M - N, rows spill into request b+1
// or past the workspace (strided; ragged, requests never overlap but rows past B*M run off the end).
// graphsafe's sizing policies and replay guards exist to keep N and M valid; the tests use this
// kernel to show the guards catch exactly that.
#include <graphsafe/ds4/kernels.hpp>

#include "cuda_support.cuh"
#include "ragged_rows.cuh"

#include <algorithm>

namespace graphsafe::ds4::cuda {
namespace {

using namespace detail;

constexpr int kWarps = 8;

__device__ __forceinline__ void dequant_row_warp(const std::uint8_t* data, const std::uint8_t* scales,
                                                 std::uint16_t* dst, int lane) {
  if (lane < 28) {
    const uint4 w = *reinterpret_cast<const uint4*>(data + lane * 16);
    uint4 lo, hi;
    dequant16(w, scales[lane >> 2], lo, hi);
    reinterpret_cast<uint4*>(dst + lane * 16)[0] = lo;
    reinterpret_cast<uint4*>(dst + lane * 16)[1] = hi;
  } else {
    const int k = (lane - 28) * 2;
    const uint4* src = reinterpret_cast<const uint4*>(data + kNopeDim);
    uint4* d = reinterpret_cast<uint4*>(dst + kNopeDim);
    d[k] = src[k];
    d[k + 1] = src[k + 1];
  }
}

// phase 0: compressed rows (step 5); phase 1: SWA rows (step 6). Two launches, in that order, so an
// undersized N resolves exactly as in the seed: the SWA rows overwrite the compressed rows >= N.
__global__ void __launch_bounds__(kWarps * 32) gather_kernel(const GatherArgs a, CacheView swa, CacheView cmp,
                                                             int phase) {
  const int b = blockIdx.y, lane = threadIdx.x & 31;
  const int L = max(a.seq_lens[b], 0);
  const int n_c = a.ratio > 1 ? L / a.ratio : 0;
  const int sl = min(L, a.window);
  const int p = L - 1;
  // Strided: request b at b*M, SWA rows at offset N. Ragged: at row0(b), SWA rows after the n_c
  // compressed rows (a.ragged is uniform over the grid: the whole CTA takes the branch).
  const long long row0 = a.ragged ? ragged_row0<kWarps * 32>(a.seq_lens, b, a.ratio, a.window)
                                  : static_cast<long long>(b) * a.M;
  const long long swa_row = a.ragged ? n_c : a.N;
  const int r_begin = phase == 0 ? 0 : n_c, r_end = phase == 0 ? n_c : n_c + sl;
  for (int r = r_begin + blockIdx.x * kWarps + (threadIdx.x >> 5); r < r_end; r += gridDim.x * kWarps) {
    long long slot;
    std::uint16_t* dst;
    CacheView cv;
    if (r < n_c) {
      const int blk = a.cmp_block_table[static_cast<long long>(b) * a.cmp_blocks_per_req + r / cmp.block_tokens];
      slot = static_cast<long long>(blk) * cmp.block_tokens + r % cmp.block_tokens;
      dst = a.ws + (row0 + r) * kHeadDim;
      cv = cmp;
    } else {
      const int i = r - n_c;
      const int pos = p - sl + 1 + i;
      const int blk = a.swa_block_table[static_cast<long long>(b) * a.swa_blocks_per_req + pos / swa.block_tokens];
      slot = static_cast<long long>(blk) * swa.block_tokens + pos % swa.block_tokens;
      dst = a.ws + (row0 + swa_row + i) * kHeadDim;  // deliberately unchecked against M (see header)
      cv = swa;
    }
    if (!cv.valid(slot)) continue;  // unallocated block: nothing to read
    dequant_row_warp(cv.data(slot), cv.scales(slot), dst, lane);
  }
}

}  // namespace

void gather_workspace(const GatherArgs& a, cudaStream_t stream) {
  const char* fn = "gather_workspace";
  require_batch(fn, a.batch);
  require_ratio(fn, a.ratio);
  if (a.window <= 0) bad_arg(fn, "window", a.window, ">= 1");
  require_ptr(fn, "seq_lens", a.seq_lens);
  require_ptr(fn, "ws", a.ws);
  require_cache(fn, "swa", a.swa);
  require_ptr(fn, "swa_block_table", a.swa_block_table);
  if (a.N < 0 || a.M < a.N) bad_arg(fn, "M - N", a.M - a.N, ">= 0 with N >= 0");
  if (reinterpret_cast<std::uintptr_t>(a.ws) % 16 != 0)
    bad_arg(fn, "ws % 16", static_cast<long long>(reinterpret_cast<std::uintptr_t>(a.ws) % 16), "0");
  CacheView cmp = view_of(a.swa);
  if (a.ratio > 1) {
    require_cache(fn, "cmp", a.cmp);
    require_ptr(fn, "cmp_block_table", a.cmp_block_table);
    cmp = view_of(a.cmp);
  }
  // Static grid: enough CTAs per request to fill the GPU; rows are walked grid-stride.
  const int per_req = std::max(1, std::min(64, 8 * device_sm_count() / a.batch));
  if (a.ratio > 1) {
    gather_kernel<<<dim3(per_req, a.batch), kWarps * 32, 0, stream>>>(a, view_of(a.swa), cmp, 0);
    check_launch("gather_workspace (compressed rows)");
  }
  gather_kernel<<<dim3(std::max(1, per_req / 16), a.batch), kWarps * 32, 0, stream>>>(a, view_of(a.swa), cmp, 1);
  check_launch("gather_workspace (SWA rows)");
}

}  // namespace graphsafe::ds4::cuda
