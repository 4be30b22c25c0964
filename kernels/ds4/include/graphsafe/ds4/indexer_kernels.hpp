// GPU launchers of the lightning indexer (graphsafe/ds4/indexer.hpp describes the math, the cache
// layout and the selection rule; ref:: there is the CPU twin of each launcher). Like kernels.hpp:
// plain device pointers and a stream, no host synchronisation and no allocation (capturable), bad
// arguments rejected with std::invalid_argument naming the value and the allowed values; lengths
// that change between replays are read from device memory.
#pragma once

#include <graphsafe/ds4/device_problem.hpp>
#include <graphsafe/ds4/indexer.hpp>
#include <graphsafe/ds4/kernels.hpp>

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace graphsafe::ds4 {
namespace cuda {

// One CTA per output row: row_index[i] = j of the request whose token 0 is state row state_base[i];
// written to `cache` at slots[i] (< 0 skips). State: [tokens, 256] fp32 each for kv and score.
void indexer_compress_insert(const float* kv_state, const float* score_state, const std::int64_t* state_base,
                             const std::int32_t* row_index, const std::int32_t* slots, int n,
                             const float* norm_weight, float rope_theta, float eps, IndexerCache cache,
                             cudaStream_t stream);

// Which tensor-core path computes the scores. wgmma (sm_90a): a producer warp bulk-copies 64-row
// tiles of keys into a shared-memory ring, consumer warpgroups widen the fp8 key bytes to f16 once
// in registers and run wgmma m64n64k16 against the queries widened to f16 in shared memory (fp8
// wgmma is not used: its accumulator keeps fewer bits than the fp32 that the reference's tolerance
// assumes); it needs cache.block_rows to be a multiple of 64 (a tile lies in one block).
// mma_sync (sm_89+): mma.sync m16n8k32 e4m3, which sm_90 runs as HMMA after widening both operands
// in the instruction stream. automatic: wgmma on compute capability 9.x when block_rows allows it,
// else mma_sync.
enum class IndexerEngine { automatic, mma_sync, wgmma };

struct IndexerScoreArgs {
  int batch = 0;
  std::int64_t N = 0;                          // row stride of logits (rows past it are not scored)
  const std::int32_t* seq_lens = nullptr;      // [B] device; n_c = seq_len / 4
  const std::uint8_t* q = nullptr;             // fp8 e4m3 [B, 64, 128]
  const float* weights = nullptr;              // [B, 64]
  IndexerCache cache;                          // device base
  const std::int32_t* block_table = nullptr;   // [B, blocks_per_req] (the C4 compressed block table)
  int blocks_per_req = 0;
  float* logits = nullptr;                     // out [B, N]: rows s < min(n_c(b), N) written
  IndexerEngine engine = IndexerEngine::automatic;
};
// Tensor cores, fp32 accumulate (IndexerEngine). No bound check against N (see the header comment).
void indexer_score(const IndexerScoreArgs& a, cudaStream_t stream);

// Copies make_indexer_inputs' arrays to the device (synchronous; not under capture).
struct DeviceIndexerInputs {
  IndexerCache cache;                 // device base
  std::uint8_t* q = nullptr;
  float* weights = nullptr;
  DeviceBytes storage;
};
DeviceIndexerInputs upload(const ref::IndexerInputs& in);

inline constexpr int kIndexerMaxTopk = 2048;   // K up to V4-Pro's C4 1024, with room

struct IndexerTopkArgs {
  int batch = 0;
  std::int64_t N = 0;                          // as for indexer_score; B * N <= 2^31 - 1
  int k = 512;                                 // K (<= kIndexerMaxTopk): row stride of topk_local
  const std::int32_t* seq_lens = nullptr;      // [B] device
  const float* logits = nullptr;               // [B, N] from indexer_score
  std::int32_t* topk_local = nullptr;          // out [B, K]; may be null when `lists` is given
  // Optional (lists.cmp_idx != nullptr): also write the paged attention's index lists of this C4
  // layer -- cmp_idx / cmp_lens / swa_idx / swa_lens, exactly what combine_paged writes from
  // topk_local -- so the layer needs no combine launch. One query token per request (query_tokens
  // 1), ratio 4, lists.topk == k; lists.topk_local is not read.
  PagedIndexArgs lists;
};
// One CTA per request: a radix select of the K-th best score (a 12-bit histogram over every row,
// then two 10-bit passes over the rows of the threshold bin only), then the picked rows are
// written in ascending row order (the selection rule of indexer.hpp) without a sort: each warp
// places the picks of its own span of rows. Needs no workspace beyond the logits. Rows past
// min(n_c, N) are never read.
void indexer_topk(const IndexerTopkArgs& a, cudaStream_t stream);

}  // namespace cuda
}  // namespace graphsafe::ds4
