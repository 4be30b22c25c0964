// DS4 sparse attention, warp-specialized kernel: the two consumer warpgroups.
//   math warpgroup (0): S = Q K^T (one chain of 32 wgmma m64n64k16, A = Q, B = K, both K-major),
//     the online softmax (it owns m and l), P (bf16) and the rescale factors handed to the PV
//     warpgroup through shared memory, and O[:, 0 .. 255] += P V (wgmma m64n128k16 pairs, A = P
//     from registers, B = the K tile read MN-major).
//   PV warpgroup (1): O[:, 256 .. 511] += P V with P from shared memory (SS wgmma); its PV of tile
//     j - 1 overlaps the math warpgroup's S of tile j.
// Both release the stage (EMPTY[stage]) once their PV of it is done. O is 128 fp32 per thread:
// heads hrow[0..1] = 16 w4 + lane / 4 (+ 8), dims 256 c + 8 nb + 2 (lane % 4) (+ 1).
#pragma once

#include "config.cuh"
#include "params.cuh"
#include "probe.cuh"

namespace graphsafe::ds4::cuda::attention {

// PV as two m64n128k16 per k step (o_lo: dims +0 .. 127 of the warpgroup's 256, o_hi: +128 ..):
// ptxas checks an instruction's operands against the kernel-wide register count, and an
// m64n256k16 has 128 accumulators.
constexpr std::uint64_t kPvHalf = (16 * 128) >> 4;  // descriptor step: 128 dims = 16 core-matrix columns

// S = Q K^T of the tile: all 64 rows over all 512 dims in one chain of 32 wgmma m64n64k16 with
// running descriptors (laundered each step: all 32 precomputed would take 64 registers). Issued and
// committed; wait<0> ends it. The first step ignores the accumulators (scale-d 0), so they are not
// zeroed per tile.
__device__ __forceinline__ void s_issue(float (&sp)[32], const std::uint8_t* Qs, const std::uint8_t* Kt) {
  std::uint64_t k_desc = wgmma_desc(Kt, 128, kWgRowSbo);
  std::uint64_t q_desc = wgmma_desc(Qs, 128, kWgRowSbo);
  wgmma_fence();
#pragma unroll
  for (int kk = 0; kk < kHeadDim / 16; ++kk) {
    wgmma_m64n64k16(sp, q_desc, k_desc, kk > 0 ? 1 : 0);
    q_desc = launder(q_desc + 16);
    k_desc = launder(k_desc + 16);
  }
  wgmma_commit();
}

// The side that hands a buffer over waits too (barrier.sync, not barrier.arrive): with an arrive,
// compute-sanitizer racecheck reports hazards on the rescale factors handed from the math warpgroup
// to the PV warpgroup; both sides waiting costs no measurable time.
__device__ __forceinline__ void handoff(int bar) { bar_sync(bar, kWsConsumers); }

// O *= the rescale factors of the thread's two heads (both consumer warpgroups, each tile).
__device__ __forceinline__ void rescale_o(float (&o)[128], float a0, float a1) {
#pragma unroll
  for (int nb = 0; nb < 32; ++nb) {
    o[4 * nb + 0] *= a0;
    o[4 * nb + 1] *= a0;
    o[4 * nb + 2] *= a1;
    o[4 * nb + 3] *= a1;
  }
}

// The math warpgroup's tile loop over n tiles; leaves (m, l) in registers (l a full row sum) and
// hands them to the PV warpgroup.
template <class Probe>
__device__ __forceinline__ void math_warpgroup(const Params& p, int n, float (&o)[128], float (&m)[2],
                                               float (&l)[2], int w4, int qr, int qc, int ct, int tid, Probe& probe) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  const WsSmemPtrs sm = ws_smem(smem);
  float (&o_lo)[64] = *reinterpret_cast<float(*)[64]>(o);
  float (&o_hi)[64] = *reinterpret_cast<float(*)[64]>(o + 64);
  // P (head h, tile row k) lives at (h / 8) kWsPSbo + (k / 8) 128 + (h % 8) 16 + (k % 8) 2: the
  // thread's pair (hrow[jj], 8 nb + qc) at pst + jj kWsPSbo + 128 nb (a warp's 4-byte stores
  // fall in 32 distinct banks).
  std::uint8_t* pst = sm.p + 2 * w4 * kWsPSbo + qr * 16 + qc * 2;
  float s[32];
#pragma unroll
  for (int e = 0; e < 32; ++e) s[e] = 0.f;  // defined once; each chain overwrites them
  for (int j = 0; j < n; ++j) {
    const int st = j & 1;
    bar_sync(kBarFull0 + st, kWsThreads);
    probe.stamp(tl::full + (j & 7), tid == 0);
    const std::uint8_t* Kt = sm.k + st * kWgKBytes;
    // Valid-row bits of the thread's 16 score columns (8 nb + qc + e1: bit 2 nb + e1), read
    // before the MMAs so their latency hides behind S.
    unsigned vmask = 0;
#pragma unroll
    for (int nb = 0; nb < 8; ++nb)
#pragma unroll
      for (int e1 = 0; e1 < 2; ++e1) vmask |= (sm.vld[st * 64 + nb * 8 + qc + e1] != 0 ? 1u : 0u) << (2 * nb + e1);
    s_issue(s, sm.q, Kt);
    wgmma_wait<0>();
    probe.stamp(tl::s_done + (j & 7), tid == 0);
    bar_sync(kBarPFree, kWsConsumers);
    probe.stamp(tl::c_x_bar + (j & 3), tid == 0 && j < 4);

    // Online softmax over the tile's 64 rows (thread: heads hrow[0] / hrow[1], rows 8 nb + qc, + 1).
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int nb = 0; nb < 8; ++nb)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float sv = (vmask >> (2 * nb + (e & 1))) & 1u ? s[4 * nb + e] * p.scale_log2 : -INFINITY;
        s[4 * nb + e] = sv;
        mx[e >> 1] = fmaxf(mx[e >> 1], sv);
      }
    float mu[2], alpha[2];
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      mx[jj] = fmaxf(mx[jj], __shfl_xor_sync(0xffffffffu, mx[jj], 1));
      mx[jj] = fmaxf(mx[jj], __shfl_xor_sync(0xffffffffu, mx[jj], 2));
      const float mn = fmaxf(m[jj], mx[jj]);
      mu[jj] = mn == -INFINITY ? 0.f : mn;
      alpha[jj] = exp2_ftz(m[jj] - mu[jj]);
      l[jj] *= alpha[jj];
      m[jj] = mn;
    }
    // P in the A-operand layout of m64nNk16: k step ks takes rows 16 ks .. 16 ks + 15, i.e. the
    // accumulator pairs of column blocks 2 ks and 2 ks + 1.
    std::uint32_t pa[16];
    float sum[2] = {0.f, 0.f};
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      const float p0 = exp2_ftz(s[4 * nb] - mu[0]), p1 = exp2_ftz(s[4 * nb + 1] - mu[0]);
      const float p2 = exp2_ftz(s[4 * nb + 2] - mu[1]), p3 = exp2_ftz(s[4 * nb + 3] - mu[1]);
      sum[0] += p0 + p1;
      sum[1] += p2 + p3;
      pa[2 * nb] = pack_bf16x2(p0, p1);
      pa[2 * nb + 1] = pack_bf16x2(p2, p3);
    }
    l[0] += sum[0];
    l[1] += sum[1];
    // Hand P and the rescale factors to the PV warpgroup. Free to overwrite: P_FREE of tile j
    // above came after the PV warpgroup's PV of tile j - 1, the last reader of P and alpha.
#pragma unroll
    for (int nb = 0; nb < 8; ++nb) {
      *reinterpret_cast<std::uint32_t*>(pst + 128 * nb) = pa[2 * nb];
      *reinterpret_cast<std::uint32_t*>(pst + kWsPSbo + 128 * nb) = pa[2 * nb + 1];
    }
    fence_proxy_async();  // P is read by wgmma (async proxy); alpha by plain loads, stored after
    sm.alpha[ct] = make_float2(alpha[0], alpha[1]);
    handoff(kBarPReady);
    rescale_o(o, alpha[0], alpha[1]);
    probe.stamp(tl::c_pv_start + (j & 3), tid == 0 && j < 4);
    {
      // O[:, 0 .. 255] += P V (A = P from registers, B = the K tile read MN-major).
      const std::uint64_t v_desc = launder(wgmma_desc(Kt, kWgRowSbo, 128));
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kTileRows / 16; ++ks) {
        const std::uint64_t vd = v_desc + ks * ((2 * kWgRowSbo) >> 4);
        wgmma_m64n128k16_rs_tb(o_lo, pa[4 * ks], pa[4 * ks + 1], pa[4 * ks + 2], pa[4 * ks + 3], vd);
        wgmma_m64n128k16_rs_tb(o_hi, pa[4 * ks], pa[4 * ks + 1], pa[4 * ks + 2], pa[4 * ks + 3], vd + kPvHalf);
      }
      wgmma_commit();
      wgmma_wait<0>();
    }
    probe.stamp(tl::pv_done + (j & 7), tid == 0);
    if (j + 2 < n) bar_arrive(kBarEmpty0 + st, kWsThreads);  // the producers refill this stage
  }
  // The row sum is a quad sum; (m, l) go to the PV warpgroup's thread with the same rows.
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) {
    l[jj] += __shfl_xor_sync(0xffffffffu, l[jj], 1);
    l[jj] += __shfl_xor_sync(0xffffffffu, l[jj], 2);
  }
  sm.ml[ct] = make_float4(m[0], m[1], l[0], l[1]);
  bar_sync(kBarQ, kWsConsumers);
}

// The PV warpgroup's tile loop; receives (m, l) from the math warpgroup at the end.
__device__ __forceinline__ void pv_warpgroup(int n, float (&o)[128], float (&m)[2], float (&l)[2], int ct) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  const WsSmemPtrs sm = ws_smem(smem);
  float (&o_lo)[64] = *reinterpret_cast<float(*)[64]>(o);
  float (&o_hi)[64] = *reinterpret_cast<float(*)[64]>(o + 64);
  const std::uint64_t p_desc = wgmma_desc(sm.p, 128, kWsPSbo);
  for (int j = 0; j < n; ++j) {
    const int st = j & 1;
    bar_sync(kBarFull0 + st, kWsThreads);
    const std::uint8_t* Kt = sm.k + st * kWgKBytes;
    handoff(kBarPFree);  // this warpgroup's PV of tile j - 1 is done
    bar_sync(kBarPReady, kWsConsumers);
    const float2 a = sm.alpha[ct];
    rescale_o(o, a.x, a.y);
    {
      const std::uint64_t v_desc = launder(wgmma_desc(Kt + 32 * 128, kWgRowSbo, 128));
      wgmma_fence();
#pragma unroll
      for (int ks = 0; ks < kTileRows / 16; ++ks) {
        const std::uint64_t vd = v_desc + ks * ((2 * kWgRowSbo) >> 4);
        wgmma_m64n128k16_tb(o_lo, p_desc + ks * 16, vd);
        wgmma_m64n128k16_tb(o_hi, p_desc + ks * 16, vd + kPvHalf);
      }
      wgmma_commit();
      wgmma_wait<0>();
    }
    if (j + 2 < n) bar_arrive(kBarEmpty0 + st, kWsThreads);  // the producers refill this stage
  }
  bar_sync(kBarQ, kWsConsumers);
  const float4 ml = sm.ml[ct];
  m[0] = ml.x;
  m[1] = ml.y;
  l[0] = ml.z;
  l[1] = ml.w;
}

// Without a cluster merge: splits == 1 -> the normalized bf16 output (with the sink); otherwise the
// split's partial O and (m, l) into the scratch for combine_splits_kernel.
__device__ __forceinline__ void store_unmerged(const Params& p, int b, int head0, long long part, const float (&o)[128],
                                               const float (&m)[2], const float (&l)[2], const int (&hrow)[2], int c,
                                               int lane, int qc) {
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
