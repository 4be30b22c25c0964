// DS4 sparse attention: the kernel parameters and the host entry points of the attention kernels
// (launch.cuh defines them; instantiations/*.cu instantiate them per row source).
//
//   Params p = paged_params(args);             // sparse_attention.cu: checks the arguments
//   run<true, NoProbe>(p, args.c, options, stream, "sparse_attention_kernel<paged>");
#pragma once

#include <graphsafe/ds4/detail/cache_view.hpp>
#include <graphsafe/ds4/kernels.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>

namespace graphsafe::ds4::cuda::attention {

// One launch's arguments, passed by value (__grid_constant__ layout: the kernels read it from the
// constant bank).
struct Params {
  int B, H, splits;
  float scale_log2;  // scale * log2(e)
  const std::uint16_t* q;
  const float* sink;
  std::uint16_t* out;
  float* part_o;     // [B, splits, H, 512]
  float* part_ml;    // [B, splits, H, 2]
  // paged-direct rows (kPaged)
  detail::CacheView swa, cmp;
  const std::int32_t *swa_idx, *swa_lens, *cmp_idx, *cmp_lens;
  int swa_width, cmp_width;
  // workspace rows (!kPaged)
  const std::uint16_t* ws;
  long long ws_rows;
  const std::int32_t *idx, *lens;
  int width;
  int cluster;       // ws kernel: 1 = the splits of a (request, head group) form a cluster
};

// Arguments checked and copied into Params (sparse_attention.cu).
Params paged_params(const PagedAttentionArgs& a);
Params workspace_params(const WorkspaceAttentionArgs& a);

// Launches the attention of one layer (the ws or the mma.sync kernel, then the combine kernel when
// the splits are merged through the scratch). Probe: the kernel's instrumentation policy (probe.cuh).
template <bool kPaged, class Probe>
void run(Params& p, const AttentionCommon& c, const AttentionOptions& options, cudaStream_t stream,
         const char* name);

// The split merge through the scratch: combine_splits_kernel over [B, splits, H] partials.
void launch_combine(const Params& p, const AttentionCommon& c, cudaStream_t stream);

}  // namespace graphsafe::ds4::cuda::attention
