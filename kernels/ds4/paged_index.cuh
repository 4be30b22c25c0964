// The paged attention's index lists (cuda::PagedIndexArgs, kernels.hpp), entry by entry: shared by
// combine_paged, which builds them from topk_local, and the indexer's top-k, which writes them
// straight from its selection. Internal to kernels/ds4 (not installed).
#pragma once

#include <graphsafe/ds4/kernels.hpp>

#include "cuda_support.cuh"

#include <cuda_runtime_api.h>

#include <climits>
#include <cstdint>

namespace graphsafe::ds4::cuda::detail {

// The checks of combine_paged's arguments. `picks_read`: C4's topk_local is an input (combine_paged);
// the indexer's top-k, which writes the lists from its own selection, passes false.
inline void check_paged_index_args(const char* fn, const PagedIndexArgs& a, bool picks_read = true) {
  require_batch(fn, a.batch);
  require_ratio(fn, a.ratio);
  if (a.window <= 0) bad_arg(fn, "window", a.window, ">= 1");
  require_query_tokens(fn, a.query_tokens);
  if (static_cast<long long>(a.batch) * a.query_tokens > INT_MAX)
    bad_arg(fn, "batch * query_tokens", static_cast<long long>(a.batch) * a.query_tokens, "<= 2^31-1 (query rows)");
  require_ptr(fn, "seq_lens", a.seq_lens);
  require_ptr(fn, "swa_block_table", a.swa_block_table);
  require_ptr(fn, "swa_idx", a.swa_idx);
  require_ptr(fn, "swa_lens", a.swa_lens);
  if (a.swa_block_tokens <= 0) bad_arg(fn, "swa_block_tokens", a.swa_block_tokens, ">= 1");
  if (a.ratio > 1 && a.cmp_idx != nullptr) {
    require_ptr(fn, "cmp_lens", a.cmp_lens);
    require_ptr(fn, "cmp_block_table", a.cmp_block_table);
    if (a.cmp_block_entries <= 0) bad_arg(fn, "cmp_block_entries", a.cmp_block_entries, "256 / ratio");
    if (a.ratio == 4) {
      if (picks_read) require_ptr(fn, "topk_local", a.topk_local);
      if (a.cmp_width < a.topk) bad_arg(fn, "cmp_width", a.cmp_width, ">= topk for C4");
    }
  }
}

// The cache slot of compressed entry c in block `blk` (its table entry): the block's slot base +
// offset, -1 for an unmapped block.
__device__ __forceinline__ std::int32_t cmp_slot_in_block(const PagedIndexArgs& a, int blk, int c) {
  return blk >= 0 ? blk * a.cmp_block_entries + c % a.cmp_block_entries : -1;
}
// The same, looking the block of compressed entry c of request b up in the block table.
__device__ __forceinline__ std::int32_t paged_cmp_slot(const PagedIndexArgs& a, int b, int c) {
  return cmp_slot_in_block(a, a.cmp_block_table[static_cast<long long>(b) * a.cmp_blocks_per_req + c / a.cmp_block_entries], c);
}

// Query row `row` (request b, attending like a one-token request of length L): its window list
// swa_idx[row, 0 .. W) (the last min(L, W) positions, then -1) and swa_lens[row]. The calling
// CTA's threads share the entries.
__device__ __forceinline__ void write_swa_list(const PagedIndexArgs& a, int row, int b, int L) {
  const int swa = min(L, a.window);
  const int p = L - 1;
  for (int i = threadIdx.x; i < a.window; i += blockDim.x) {
    int v = -1;
    if (i < swa) {
      const int pos = p - swa + 1 + i;
      const int blk = a.swa_block_table[static_cast<long long>(b) * a.swa_blocks_per_req + pos / a.swa_block_tokens];
      if (blk >= 0) v = blk * a.swa_block_tokens + pos % a.swa_block_tokens;
    }
    a.swa_idx[static_cast<long long>(row) * a.window + i] = v;
  }
  if (threadIdx.x == 0) a.swa_lens[row] = swa;
}

}  // namespace graphsafe::ds4::cuda::detail
