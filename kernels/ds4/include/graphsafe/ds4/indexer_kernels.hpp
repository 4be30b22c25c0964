// GPU launchers of the lightning indexer (graphsafe/ds4/indexer.hpp describes the math, the cache
// layout and the selection rule; ref:: there is the CPU twin of each launcher). Like kernels.hpp:
// plain device pointers and a stream, no host synchronisation and no allocation (capturable), bad
// arguments rejected with std::invalid_argument naming the value and the allowed values; lengths
// that change between replays are read from device memory.
#pragma once

#include <graphsafe/ds4/device_problem.hpp>
#include <graphsafe/ds4/indexer.hpp>

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

struct IndexerScoreArgs {
  int batch = 0;
  std::int64_t N = 0;                          // row stride of logits / ids (>= every n_c to be in bounds)
  const std::int32_t* seq_lens = nullptr;      // [B] device; n_c = seq_len / 4
  const std::uint8_t* q = nullptr;             // fp8 e4m3 [B, 64, 128]
  const float* weights = nullptr;              // [B, 64]
  IndexerCache cache;                          // device base
  const std::int32_t* block_table = nullptr;   // [B, blocks_per_req] (the C4 compressed block table)
  int blocks_per_req = 0;
  float* logits = nullptr;                     // out [B, N]: rows s < n_c(b) written
  std::int32_t* ids = nullptr;                 // out [B, N]: s at [b*N + s], the values top-k sorts
};
// Tensor cores (fp8 mma.sync, fp32 accumulate). No bound check against N (see the header comment).
void indexer_score(const IndexerScoreArgs& a, cudaStream_t stream);

struct IndexerTopkArgs {
  int batch = 0;
  std::int64_t N = 0;                          // as for indexer_score; B * N <= 2^31 - 1
  int k = 512;                                 // K: row stride of topk_local
  const std::int32_t* seq_lens = nullptr;      // [B] device
  const float* logits = nullptr;               // [B, N] from indexer_score
  const std::int32_t* ids = nullptr;           // [B, N] from indexer_score
  float* sorted_logits = nullptr;              // scratch [B, N]
  std::int32_t* sorted_ids = nullptr;          // scratch [B, N]
  std::int32_t* segment_offsets = nullptr;     // scratch [2 * B]
  void* temp = nullptr;                        // indexer_topk_temp_bytes(batch, N)
  std::size_t temp_bytes = 0;
  std::int32_t* topk_local = nullptr;          // out [B, K]
};
// Copies make_indexer_inputs' arrays to the device (synchronous; not under capture).
struct DeviceIndexerInputs {
  IndexerCache cache;                 // device base
  std::uint8_t* q = nullptr;
  float* weights = nullptr;
  DeviceBytes storage;
};
DeviceIndexerInputs upload(const ref::IndexerInputs& in);

// CUB's segmented radix sort (stable, descending) over each request's n_c scores, then the K best
// (or the short-context rows) into topk_local. The temporary storage depends on B and N only.
std::size_t indexer_topk_temp_bytes(int batch, std::int64_t N);
void indexer_topk(const IndexerTopkArgs& a, cudaStream_t stream);

}  // namespace cuda
}  // namespace graphsafe::ds4
