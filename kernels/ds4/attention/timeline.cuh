// DS4 sparse attention, benchmark builds only: the timeline probe (per CTA, clock64 stamps at the
// phase edges of the ws kernel, so the per-layer time splits into launch gap, prologue, per-tile
// producer / consumer time and merge; kernels/ds4/timeline.hpp is the record layout) and
// the paged attention instantiated with it. bench/ds4_attention_bench.cu includes this file in its
// -DGRAPHSAFE_DS4_TIMELINE build; the library never does.
//
//   timeline::timeline_reset();
//   timeline::sparse_attention_paged(args, stream);   // in place of cuda::sparse_attention_paged
//   std::vector<unsigned long long> rec = timeline::timeline_read();   // [records][kSlots]
#pragma once

#include "launch.cuh"

#include <algorithm>
#include <vector>

namespace graphsafe::ds4::cuda::attention {

__device__ unsigned long long g_tl[tl::kSlots * tl::kMaxRecords];
__device__ unsigned int g_tl_count;

__device__ __forceinline__ unsigned long long tl_gtime() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

// stamp_after names a register the stamp follows in program order; it does not make the stamp
// wait for that register's load to land.
struct TimelineProbe {
  unsigned rec;
  __device__ __forceinline__ void begin() {
    __shared__ unsigned int rec_shared;
    const unsigned long long t0 = clock64(), g0 = tl_gtime();
    if (threadIdx.x == 0) {
      unsigned sm;
      asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
      rec_shared = atomicAdd(&g_tl_count, 1u);
      if (rec_shared < tl::kMaxRecords) {
        unsigned long long* r = g_tl + rec_shared * tl::kSlots;
        r[tl::gtime_entry] = g0;
        r[tl::clock_entry] = t0;
        r[tl::cta_id] = (static_cast<unsigned long long>(sm) << 32) | (blockIdx.x | (blockIdx.y << 8) | (blockIdx.z << 24));
      }
    }
    __syncthreads();
    rec = rec_shared;
  }
  __device__ __forceinline__ void tiles(int n) {
    if (threadIdx.x == 0 && rec < tl::kMaxRecords) g_tl[rec * tl::kSlots + tl::tiles] = n;
  }
  __device__ __forceinline__ void stamp(int slot, bool cond) {
    if (cond && rec < tl::kMaxRecords) g_tl[rec * tl::kSlots + slot] = clock64();
  }
  __device__ __forceinline__ void stamp_after(int slot, bool cond, unsigned reg) {
    asm volatile("" ::"r"(reg) : "memory");
    stamp(slot, cond);
  }
  __device__ __forceinline__ void exit(bool cond) {
    if (cond && rec < tl::kMaxRecords) {
      g_tl[rec * tl::kSlots + tl::clock_exit] = clock64();
      g_tl[rec * tl::kSlots + tl::gtime_exit] = tl_gtime();
    }
  }
};

}  // namespace graphsafe::ds4::cuda::attention

namespace graphsafe::ds4::cuda::timeline {

inline void timeline_reset() {
  const unsigned zero = 0;
  detail::check_cuda(cudaMemcpyToSymbol(attention::g_tl_count, &zero, sizeof zero), "timeline reset");
}
inline std::vector<unsigned long long> timeline_read() {
  unsigned count = 0;
  detail::check_cuda(cudaMemcpyFromSymbol(&count, attention::g_tl_count, sizeof count), "timeline count");
  count = std::min(count, static_cast<unsigned>(kMaxRecords));
  std::vector<unsigned long long> v(static_cast<std::size_t>(count) * kSlots);
  if (count > 0)
    detail::check_cuda(cudaMemcpyFromSymbol(v.data(), attention::g_tl, v.size() * sizeof(unsigned long long)),
                       "timeline read");
  return v;
}
// The paged-direct attention with the timeline kernel (same arguments and checks as
// cuda::sparse_attention_paged).
inline void sparse_attention_paged(const PagedAttentionArgs& a, cudaStream_t stream,
                                   const AttentionOptions& options = {}) {
  attention::Params p = attention::paged_params(a);
  attention::run<true, attention::TimelineProbe>(p, a.c, options, stream, "sparse_attention_kernel<paged, timeline>");
}

}  // namespace graphsafe::ds4::cuda::timeline
