// DS4 sparse attention, warp-specialized kernel: the end of a CTA once its tile loop is done and
// O, m, l (base-2 running max and row sum) of its 64 heads sit in the consumers' registers.
//   cluster_merge   2 or 4 splits of one (request, head group) form a cluster and merge over
//                   distributed shared memory, ranks in split order (combine_splits_kernel's
//                   arithmetic), each rank writing the bf16 output of its share of the heads;
//   store_result    no cluster: the bf16 output (one split) or the fp32 partials and (m, l) for
//                   combine_splits_kernel (several splits).
// Register mapping of O (wgmma m64nNk16 accumulators): consumer warpgroup c, warp w4, lane: heads
// hrow[jj] = 16 w4 + lane / 4 + 8 jj, dims 256 c + 8 nb + qc (+1), qc = 2 (lane % 4), in
// o[4 nb + 2 jj] (+1).
#pragma once

#include "config.cuh"
#include "params.cuh"
#include "probe.cuh"

#include <cooperative_groups.h>

#include <type_traits>

namespace graphsafe::ds4::cuda::attention {

namespace cg = cooperative_groups;

// The two-rank cluster merge receives the peer's O in this many chunks, each counted by its own
// mbarrier, so merging overlaps the push (a merge batch is 8 float4).
constexpr int kMergeChunks = 4;

// The producer warpgroup's part in the cluster merge: its arrivals at the merge's cluster
// barriers (A, and B for more than two ranks). The producers never rejoin the consumers' code
// (their register budget is smaller).
__device__ __forceinline__ void cluster_merge_producer() {
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  if (cluster.num_blocks() != 2) cluster.sync();  // the two-rank merge has no barrier B
}

// The consumers' cluster merge (256 threads: tid < kWsConsumers). smem: the CTA's WsSmem; the Q / K
// area becomes the merge area (MergeArea) once every rank has passed barrier A.
template <class Probe>
__device__ __forceinline__ void cluster_merge(const Params& p, std::uint8_t* smem, Probe& probe, float (&o)[128],
                                              const float (&m)[2], const float (&l)[2], int b, int head0,
                                              int tid, int lane, int c, int w4, int qc, const int (&hrow)[2]) {
  // Split-K merge inside the cluster (the splits of one (request, head group); launch.cuh uses a
  // cluster only for 2 or 4 splits). Heads are dealt to ranks by consumer warp (2 ranks: warps
  // 0-1 / 2-3 of each consumer warpgroup; 4 ranks: one warp each). After barrier A (every rank
  // is done with its Q / K area, which becomes the receive area) each thread stores its O and
  // (m, l) into slot `rank` of the owner's receive area (remote stores: no round trips; the
  // owner's own threads store locally), barrier B, then all 256 consumer threads of each rank
  // merge its heads from local shared memory, ranks in split order (combine_splits_kernel's
  // arithmetic), into a bf16 stage written out with 16-byte coalesced stores. No global
  // scratch, no second kernel.
  // With every rank's O in shared memory the merge is a short rolled loop over all consumer
  // threads (keeping the owner's O in registers would select between a register and a received
  // value for each of up to 4 ranks at every step: long, cold code).
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int nr = static_cast<int>(cluster.num_blocks());
  const int per = 4 / nr;                                          // warps per warpgroup per owner
  const int owner = w4 / per;
  const int nthr = kWsConsumers / nr;                              // threads per owner
  const int li = c * (per * 32) + (w4 % per) * 32 + lane;           // index among them
  const int heads = 64 / nr;                                       // heads per owner
  float4* recv = reinterpret_cast<float4*>(smem + offsetof(WsSmem, merge.recv));  // [nr][32][nthr]
  float* mlr = reinterpret_cast<float*>(smem + offsetof(WsSmem, merge.ml));       // [nr][64][2]
  std::uint8_t* stage = smem + offsetof(WsSmem, merge.stage);                     // [heads][1040 B]
  // This rank's heads [rank * heads, +heads) are one contiguous block of the output: once every
  // consumer has staged its merged values, 16-byte coalesced stores (direct 4-byte stores touch
  // 8 heads x 16 bytes per warp store and throttle the LSU). The generic merge ends here; the
  // two-rank merge stores batch by batch.
  auto store_staged = [&](int heads) {
    bar_sync(kBarOut, kWsConsumers);
    probe.stamp(tl::staged, tid == 0);
    uint4* gout = reinterpret_cast<uint4*>(p.out + (static_cast<long long>(b) * p.H + head0 + rank * heads) * kHeadDim);
#pragma unroll 4
    for (int i = tid; i < heads * kHeadDim / 8; i += kWsConsumers)
      gout[i] = *reinterpret_cast<const uint4*>(stage + (i >> 6) * kWsOutStride + (i & 63) * 16);
    probe.exit(tid == 0);
  };
  // Thread tid will merge float4 column lm = tid % nthr of this rank's slots, rows e = tid / nthr +
  // 256 / nthr * k: the values pushed by the threads with index lm, i.e. heads g[0], g[1] and
  // dims d, d + 1 (o[]'s mapping for warp mw of a warpgroup mc). The sinks are loaded now, so
  // their latency is spent in the barriers.
  if (nr == 2) {
    // Two ranks (the C4 / C128 / C1 default): rank r owns heads [32 r, 32 r + 32), i.e. warps
    // 2r, 2r + 1 of each consumer warpgroup, which keep their O in registers; only the other
    // warps push (64 KB per CTA, into the peer's single receive slot), and each owner thread
    // merges its own values with the peer thread's of the same layout (same li). Compared with
    // every rank storing all of O into shared memory and all threads merging from there, this
    // drops 64 KB of local stores and 64 KB of loads per CTA. Same arithmetic as
    // combine_splits_kernel, ranks in split order.
    const bool mine = owner == rank;
    float sk[2] = {-INFINITY, -INFINITY};
    if (mine && p.sink != nullptr) {
      sk[0] = p.sink[head0 + hrow[0]] * kLog2e;
      sk[1] = p.sink[head0 + hrow[1]] * kLog2e;
    }
    // The push is st.async into the peer, counted by the peer's merge barriers (one arrival, the
    // expect_tx, + the pushed bytes): no barrier B with its release fence and its wait for every
    // thread of both CTAs; only the owners wait, for their own bytes. The barriers are initialized before
    // barrier A, which orders them before every other use (the peer's st.async, the expect_tx,
    // the waits; a transaction count may go below zero before the expect_tx).
    // The 64 KB arrive in kMergeChunks chunks of 32 / kMergeChunks float4 per thread, each with
    // its own barrier, (m, l) first on chunk 0's: the owners compute the merge weights and merge
    // chunk k while chunks k + 1.. are still in flight and store each merged batch at once, so
    // only the last chunk's merge and stores follow the push.
    constexpr int kChunkE = 32 / kMergeChunks;
    __shared__ alignas(8) std::uint64_t merge_bar[kMergeChunks];
    if (tid < kMergeChunks) mbar_init(&merge_bar[tid], 1);
    cluster.sync();  // A: the peer is done with its Q / K area (and its barriers are initialized)
    probe.stamp(tl::cluster_a, tid == 0);
    if (tid < kMergeChunks) mbar_arrive_expect_tx(&merge_bar[tid], kChunkE * 128 * 16 + (tid == 0 ? 16 * 2 * 8 : 0));
    if (!mine) {
      std::uint32_t rbar[kMergeChunks];
#pragma unroll
      for (int k = 0; k < kMergeChunks; ++k) rbar[k] = mapa_u32(&merge_bar[k], owner);
      if (c == 0 && (lane & 3) == 0) {
        const std::uint32_t dml = mapa_u32(mlr, owner);
#pragma unroll
        for (int jj = 0; jj < 2; ++jj) st_async_v2(dml + hrow[jj] * 8, m[jj], l[jj], rbar[0]);
      }
      const std::uint32_t dst = mapa_u32(recv + li, owner);
#pragma unroll
      for (int e = 0; e < 32; ++e)
        st_async_v4(dst + e * 128 * 16, make_float4(o[4 * e], o[4 * e + 1], o[4 * e + 2], o[4 * e + 3]), rbar[e / kChunkE]);
    } else {
      mbar_wait_cluster(&merge_bar[0], 0);
    }
    probe.stamp(tl::cluster_b, tid == 0);
    if (mine) {
      float w0[2], w1[2], inv[2];
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        const float mp = mlr[hrow[jj] * 2], lp = mlr[hrow[jj] * 2 + 1];
        const float m0 = rank == 0 ? m[jj] : mp, l0 = rank == 0 ? l[jj] : lp;
        const float m1 = rank == 0 ? mp : m[jj], l1 = rank == 0 ? lp : l[jj];
        float M = -INFINITY, L = 0.f;
        if (l0 > 0.f) M = fmaxf(M, m0);
        if (l1 > 0.f) M = fmaxf(M, m1);
        w0[jj] = l0 > 0.f ? exp2f(m0 - M) : 0.f;
        w1[jj] = l1 > 0.f ? exp2f(m1 - M) : 0.f;
        if (l0 > 0.f) L = __fmaf_rn(l0, w0[jj], L);
        if (l1 > 0.f) L = __fmaf_rn(l1, w1[jj], L);
        inv[jj] = 0.f;
        if (L > 0.f) inv[jj] = 1.f / (L + exp2f(sk[jj] - M));  // no sink: exp2(-inf) = 0
      }
      probe.stamp_after(tl::merge_weights, tid == 0, __float_as_uint(inv[1]));
      // Stage row stride 1040 B: a warp's 4-byte stores (8 heads x 4 column pairs) fall in
      // distinct banks.
      std::uint8_t* s0 = stage + (hrow[0] - rank * 32) * kWsOutStride + (c * 256 + qc) * 2;
      std::uint8_t* s1 = s0 + 8 * kWsOutStride;
      uint4* gout = reinterpret_cast<uint4*>(p.out + (static_cast<long long>(b) * p.H + head0 + rank * 32) * kHeadDim);
      // Batches of 8 received values, all loaded before the batch's first stage store (the
      // compiler does not move shared loads above shared stores it cannot disambiguate: one
      // load latency per value otherwise), and the
      // rank as a compile-time value (no selects in the loop). Fully unrolled: o[] is indexed
      // by e (a rolled loop would put O in local memory).
      auto merge = [&](auto rank_is_0) {
#pragma unroll
        for (int e0 = 0; e0 < 32; e0 += 8) {
          if (e0 > 0 && e0 % kChunkE == 0) mbar_wait_cluster(&merge_bar[e0 / kChunkE], 0);
          float4 v[8];
#pragma unroll
          for (int k = 0; k < 8; ++k) v[k] = recv[(e0 + k) * 128 + li];
#pragma unroll
          for (int k = 0; k < 8; ++k) {
            const int e = e0 + k;
            const float4 own = make_float4(o[4 * e], o[4 * e + 1], o[4 * e + 2], o[4 * e + 3]);
            const float4 x0 = decltype(rank_is_0)::value ? own : v[k], x1 = decltype(rank_is_0)::value ? v[k] : own;
            float4 a;
            a.x = __fmaf_rn(x1.x, w1[0], __fmaf_rn(x0.x, w0[0], 0.f));
            a.y = __fmaf_rn(x1.y, w1[0], __fmaf_rn(x0.y, w0[0], 0.f));
            a.z = __fmaf_rn(x1.z, w1[1], __fmaf_rn(x0.z, w0[1], 0.f));
            a.w = __fmaf_rn(x1.w, w1[1], __fmaf_rn(x0.w, w0[1], 0.f));
            *reinterpret_cast<std::uint32_t*>(s0 + e * 16) = pack_bf16x2(a.x * inv[0], a.y * inv[0]);
            *reinterpret_cast<std::uint32_t*>(s1 + e * 16) = pack_bf16x2(a.z * inv[1], a.w * inv[1]);
          }
          // Batch e0 / 8 is dims [64 k, 64 k + 64) of each warpgroup's 256, i.e. two 128-byte
          // segments per head (bytes 128 k and 512 + 128 k of its output row): once every owner
          // has staged it, 512 16-byte stores, 4 per owner, 8 lanes per segment.
          bar_sync(kBarOwners, 128);
          const int k = e0 / 8;
#pragma unroll
          for (int u = 0; u < 4; ++u) {
            const int i = li + 128 * u, h = i >> 4, sg = (i >> 3) & 1, col = i & 7;
            gout[h * 64 + sg * 32 + k * 8 + col] =
                *reinterpret_cast<const uint4*>(stage + h * kWsOutStride + sg * 512 + k * 128 + col * 16);
          }
        }
      };
      if (rank == 0)
        merge(std::true_type{});
      else
        merge(std::false_type{});
    }
    probe.stamp(tl::merged, tid == 0);
    probe.stamp(tl::staged, mine && li == 0);  // the owners stored their heads batch by batch above
    probe.exit(mine && li == 0);
    return;
  }
  const int lm = tid % nthr, e0 = tid / nthr, estep = kWsConsumers / nthr;
  const int mc = lm / (per * 32), mw = rank * per + (lm / 32) % per, ml = lm % 32;
  const int g[2] = {16 * mw + (ml >> 2), 16 * mw + (ml >> 2) + 8};
  const int d = mc * 256 + 2 * (ml & 3);
  float sink_l2[2] = {-INFINITY, -INFINITY};
  if (p.sink != nullptr) {
    sink_l2[0] = p.sink[head0 + g[0]] * kLog2e;
    sink_l2[1] = p.sink[head0 + g[1]] * kLog2e;
  }
  cluster.sync();  // A
  probe.stamp(tl::cluster_a, tid == 0);
  {
    float4* dst = (owner == rank ? recv : cluster.map_shared_rank(recv, owner)) + rank * 32 * nthr + li;
#pragma unroll
    for (int e = 0; e < 32; ++e) dst[e * nthr] = make_float4(o[4 * e], o[4 * e + 1], o[4 * e + 2], o[4 * e + 3]);
  }
  if (c == 0 && (lane & 3) == 0) {
    float* dml = (owner == rank ? mlr : cluster.map_shared_rank(mlr, owner)) + rank * 128;
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) { dml[hrow[jj] * 2] = m[jj]; dml[hrow[jj] * 2 + 1] = l[jj]; }
  }
  cluster.sync();  // B: every slot landed
  probe.stamp(tl::cluster_b, tid == 0);
  float wr[4][2], inv[2];
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) {
    float M = -INFINITY, L = 0.f;
#pragma unroll
    for (int r = 0; r < 4; ++r)
      if (r < nr && mlr[r * 128 + g[jj] * 2 + 1] > 0.f) M = fmaxf(M, mlr[r * 128 + g[jj] * 2]);
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const float lr = r < nr ? mlr[r * 128 + g[jj] * 2 + 1] : 0.f;
      wr[r][jj] = lr > 0.f ? exp2f(mlr[r * 128 + g[jj] * 2] - M) : 0.f;
      if (lr > 0.f) L = __fmaf_rn(lr, wr[r][jj], L);
    }
    inv[jj] = 0.f;
    if (L > 0.f) inv[jj] = 1.f / (L + exp2f(sink_l2[jj] - M));  // no sink: exp2(-inf) = 0
  }
  probe.stamp_after(tl::merge_weights, tid == 0, __float_as_uint(inv[1]));
  // Stage row stride 1040 B: the 8 heads of a warp's 4-byte stores fall in distinct banks.
  std::uint8_t* s0 = stage + (g[0] - rank * heads) * kWsOutStride + d * 2;
  std::uint8_t* s1 = stage + (g[1] - rank * heads) * kWsOutStride + d * 2;
  // 32 / nr rows e per thread (16 or 8), in batches of 4: all loads of a batch are issued
  // before its first use (the stage stores would otherwise keep the compiler from hoisting the
  // next row's loads above them: one shared-memory latency per row).
  for (int e = e0; e < 32; e += 4 * estep) {
    float4 v[4][4];
#pragma unroll
    for (int k = 0; k < 4; ++k)
#pragma unroll
      for (int r = 0; r < 4; ++r)
        if (r < nr) v[k][r] = recv[(r * 32 + e + k * estep) * nthr + lm];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      // acc = sum over ranks in order of O_r * w_r; a rank with l = 0 has w = 0 and O = 0, so
      // its fma leaves acc unchanged (bitwise: acc starts at +0), as the combine kernel's
      // skipped term does.
      float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        if (r >= nr) break;
        a.x = __fmaf_rn(v[k][r].x, wr[r][0], a.x);
        a.y = __fmaf_rn(v[k][r].y, wr[r][0], a.y);
        a.z = __fmaf_rn(v[k][r].z, wr[r][1], a.z);
        a.w = __fmaf_rn(v[k][r].w, wr[r][1], a.w);
      }
      const int ek = e + k * estep;
      *reinterpret_cast<std::uint32_t*>(s0 + ek * 16) = pack_bf16x2(a.x * inv[0], a.y * inv[0]);
      *reinterpret_cast<std::uint32_t*>(s1 + ek * 16) = pack_bf16x2(a.z * inv[1], a.w * inv[1]);
    }
  }
  probe.stamp(tl::merged, tid == 0);
  store_staged(heads);
  return;
}

// Without a cluster: the bf16 output (splits == 1) or this split's fp32 partial O and (m, l) at
// `part` (the [B, splits, H] index of head 0 of the group) for combine_splits_kernel.
__device__ __forceinline__ void store_result(const Params& p, const float (&o)[128], const float (&m)[2],
                                             const float (&l)[2], int b, int head0, long long part, int lane,
                                             int c, int qc, const int (&hrow)[2]) {
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) {
    const int h = hrow[jj];
    if (p.splits == 1) {
      float inv = 0.f;
      if (l[jj] > 0.f) {
        const float sterm = p.sink != nullptr ? exp2f(p.sink[head0 + h] * kLog2e - m[jj]) : 0.f;
        inv = 1.f / (l[jj] + sterm);
      }
      std::uint16_t* orow = p.out + (static_cast<long long>(b) * p.H + head0 + h) * kHeadDim + c * 256 + qc;
#pragma unroll
      for (int nb = 0; nb < 32; ++nb)
        *reinterpret_cast<std::uint32_t*>(orow + nb * 8) = pack_bf16x2(o[4 * nb + 2 * jj] * inv, o[4 * nb + 2 * jj + 1] * inv);
    } else {
      float* orow = p.part_o + (part + h) * kHeadDim + c * 256 + qc;
#pragma unroll
      for (int nb = 0; nb < 32; ++nb)
        *reinterpret_cast<float2*>(orow + nb * 8) = make_float2(o[4 * nb + 2 * jj], o[4 * nb + 2 * jj + 1]);
      if (c == 0 && (lane & 3) == 0) {
        p.part_ml[(part + h) * 2 + 0] = m[jj];
        p.part_ml[(part + h) * 2 + 1] = l[jj];
      }
    }
  }
}

}  // namespace graphsafe::ds4::cuda::attention
