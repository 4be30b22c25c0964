// DS4 sparse attention, warp-specialized kernel (sm_90a). One CTA = (split, request b, group of 64
// heads), grid (splits, B, H / 64), 384 threads = 3 warpgroups:
//   warpgroup 2 (producer, producer.cuh) gathers the tile's rows (fp8 data + scales, or bf16
//     workspace rows), dequantizes them into a double-buffered bf16 K tile (WsSmem::tiles.k) and
//     signals FULL[stage];
//   warpgroup 0 (math): S = Q K^T (one chain of 32 wgmma m64n64k16, A = Q, B = K, both K-major),
//     the online softmax (it owns m and l), P (bf16) and the rescale factors handed to warpgroup 1
//     through shared memory, and O[:, 0 .. 255] += P V (wgmma m64n128k16 pairs, A = P from
//     registers, B = the K tile read MN-major);
//   warpgroup 1 (PV): O[:, 256 .. 511] += P V with P from shared memory (SS wgmma); it releases the
//     stage (EMPTY[stage]) and the P buffer (P_FREE). Its PV of tile j - 1 overlaps the math
//     warpgroup's S of tile j.
// Then the splits merge inside the cluster (2 or 4 ranks, over distributed shared memory), or the
// partials go to the scratch for combine_splits_kernel (merge.cuh). Same numerics as the mma.sync
// engine (bf16 operands, fp32 accumulation, bf16 P, base-2 online softmax); every merge runs in
// split order. The roles, the barriers and the shared-memory plan are in config.cuh; Probe is the
// instrumentation policy (probe.cuh).
//
// This file holds the prologue (queries, lengths, the first slots), the role dispatch and the
// consumers' tile loop; the producer's loop is producer.cuh, what follows the loops merge.cuh. The
// consumers stay in the kernel function: as a device function of their own, the compiler schedules
// and allocates their loop differently (same instructions, other registers and order), which was
// measured slower; the producer and the merge compile to the same code either way.
#pragma once

#include "config.cuh"
#include "merge.cuh"
#include "params.cuh"
#include "probe.cuh"
#include "producer.cuh"

namespace graphsafe::ds4::cuda::attention {

template <bool kPaged, class Probe>
__global__ void __launch_bounds__(kWsThreads, 1) ws_kernel(const Params p) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  std::uint8_t* Qs = smem;
  std::uint8_t* Ks = smem + offsetof(WsSmem, tiles.k);  // [2][64 rows x 512] bf16, canonical layout
  std::uint8_t* Ps = Ks + 2 * kWgKBytes;                                  // P of the tile, bf16, canonical
  float2* As = reinterpret_cast<float2*>(Ps + kWsPBytes);                 // [128]: rescale factors, math -> PV
  float4* MLs = reinterpret_cast<float4*>(As + 128);                      // [128]: (m, l), math -> PV
  int* vld = reinterpret_cast<int*>(MLs + 128);                           // [2 stages][64]

  const int split = blockIdx.x, b = blockIdx.y, head0 = blockIdx.z * kGroupHeads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // Programmatic dependent launch (launch.cuh sets the attribute): this grid may start while the
  // previous kernel of the stream is still running; every global read below waits for it to finish
  // and flush here. Then the next kernel may be launched: its CTAs take the SMs ours free and run
  // up to their own wait, which hides the launch gap between back-to-back kernels. Both are
  // no-ops without the attribute.
  grid_dependency_sync();
  // Queries first (consumer threads): their loads do not depend on the lengths, so they overlap
  // the length and index loads instead of following them (they are on the first tile's critical
  // path: issuing them only after the producer's first row loads measured 0.7 us per layer slower).
  // Consumer warp cw loads heads 8 cw + lane % 8, 16-byte chunks lane / 8 + 4 i; stored into the
  // canonical layout once the consumers own their registers. Plain loads + st.shared, no cp.async:
  // every shared-memory write of this kernel is an ordinary store, which compute-sanitizer
  // racecheck orders across the cluster barriers.
  const int qh = warp * 8 + (lane & 7);
  uint4 qv[16];
  if (tid < kWsConsumers) {
    const std::uint16_t* qrow = p.q + (static_cast<long long>(b) * p.H + head0 + qh) * kHeadDim;
#pragma unroll
    for (int i = 0; i < 16; ++i) qv[i] = __ldg(reinterpret_cast<const uint4*>(qrow + ((lane >> 3) + 4 * i) * 8));
  }
  // The slot of row `row` of tile t for a request with nc compressed and TT attended rows whose
  // split ends at tile te; -1: no row. One predicated load (ld_nc_or): nothing waits for it before
  // the slot's first use.
  auto slot_of = [&](int t, int row, int nc, int TT, int te) -> int {
    const int i = t * kTileRows + row;
    const std::int32_t* src;
    if constexpr (kPaged) {
      src = i < nc ? p.cmp_idx + (static_cast<long long>(b) * p.cmp_width + i)
                   : p.swa_idx + (static_cast<long long>(b) * p.swa_width + (i - nc));
    } else {
      src = p.idx + (static_cast<long long>(b) * p.width + i);
    }
    return ld_nc_or(src, t < te && i < TT, -1);
  };
  // Producer thread ptid owns rows r0 and r0 + 8 of every tile (see the producer). Before the
  // lengths are in, it fetches its slots of the split's first three tiles as if the request were at
  // full width (every compressed and window slot attended: any request longer than the window
  // and, at C4, 4 x top-k tokens), so that these index loads overlap the length loads: lengths ->
  // indices -> rows were three dependent round trips before the first tile. Checked against the
  // lengths below; a request below full width fetches again.
  const int ptid = tid - kWsConsumers;
  const int r0 = 16 * (ptid >> 5) + (ptid & 7);
  const int nc_full = kPaged ? (p.cmp_idx != nullptr ? p.cmp_width : 0) : 0;
  const int T_full = kPaged ? nc_full + p.swa_width : p.width;
  const int nt_full = (T_full + kTileRows - 1) / kTileRows;
  const int tps_full = (nt_full + p.splits - 1) / p.splits;
  const int tb_full = split * tps_full, te_full = min(nt_full, tb_full + tps_full);
  int sl_full[3][2];
  if (tid >= kWsConsumers) {
#pragma unroll
    for (int k = 0; k < 3; ++k)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) sl_full[k][rr] = slot_of(tb_full + k, r0 + 8 * rr, nc_full, T_full, te_full);
  }
  Probe probe;
  probe.begin();
  int n_cmp = 0, T = 0;
  if constexpr (kPaged) {
    if (p.cmp_idx != nullptr) n_cmp = min(max(p.cmp_lens[b], 0), p.cmp_width);
    T = n_cmp + min(max(p.swa_lens[b], 0), p.swa_width);
  } else {
    T = min(max(p.lens[b], 0), p.width);
  }
  const int ntiles = (T + kTileRows - 1) / kTileRows;
  const int tps = (ntiles + p.splits - 1) / p.splits;
  const int t_begin = split * tps, t_end = min(ntiles, t_begin + tps);
  const int n = max(0, t_end - t_begin);
  probe.tiles(n);
  const long long part = (static_cast<long long>(b) * p.splits + split) * p.H + head0;

  if (n == 0 && !p.cluster) {
    if (p.splits == 1) {
      uint4* o = reinterpret_cast<uint4*>(p.out + (static_cast<long long>(b) * p.H + head0) * kHeadDim);
      for (int i = tid; i < kGroupHeads * kHeadDim / 8; i += kWsThreads) o[i] = make_uint4(0, 0, 0, 0);
    } else if (tid < kGroupHeads) {
      p.part_ml[(part + tid) * 2 + 0] = -INFINITY;
      p.part_ml[(part + tid) * 2 + 1] = 0.f;
    }
    return;
  }

  float o[128];
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
  // 0: math warpgroup, 1: PV warpgroup, 2: producer. Through a shuffle so that ptxas knows it is
  // warp-uniform: otherwise it treats the role branches as divergent and serializes every wgmma
  // behind a warpgroup.arrive it inserts (C7520).
  const int c = __shfl_sync(0xffffffffu, warp >> 2, 0);
  const int w4 = warp & 3;
  const int qr = lane >> 2, qc = 2 * (lane & 3);
  const int hrow[2] = {16 * w4 + qr, 16 * w4 + qr + 8};

  if (c == 2) {
    // ================================ producer ================================
    setmaxnreg_dec<kWsProducerRegs>();  // gives the consumers their 2 x (consumer - launch) x 128
    produce_tiles<kPaged>(p, Ks, vld, probe, slot_of, ptid, r0, sl_full, nc_full, T_full, n_cmp, T, t_begin, t_end, n);
    // The producers take part in the cluster merge's barriers and leave.
    if (p.cluster) cluster_merge_producer();
    return;
  }
  {
    // ================================ consumers ================================
    setmaxnreg_inc<kWsConsumerRegs>();
    if (n > 0) {
      probe.stamp_after(tl::q_landed, tid == 0, qv[15].w);
#pragma unroll
      for (int i = 0; i < 16; ++i) *reinterpret_cast<uint4*>(Qs + blk16(qh, (lane >> 3) + 4 * i)) = qv[i];
      fence_proxy_async();
      bar_sync(kBarQ, kWsConsumers);
      probe.stamp(tl::q_ready, tid == 0);
    }
#pragma unroll
    for (int e = 0; e < 128; ++e) o[e] = 0.f;
    const int ct = tid & 127;  // thread index within the consumer warpgroup
    // PV as two m64n128k16 per k step (o_lo: dims +0 .. 127 of the warpgroup's 256, o_hi: +128 ..):
    // with two producer warpgroups the launch bound is 128 registers, and ptxas checks an
    // instruction's operands against that count (an m64n256k16 has 128 accumulators).
    float (&o_lo)[64] = *reinterpret_cast<float(*)[64]>(o);
    float (&o_hi)[64] = *reinterpret_cast<float(*)[64]>(o + 64);
    constexpr std::uint64_t kPvHalf = (16 * 128) >> 4;  // descriptor step: 128 dims = 16 core-matrix columns
    // S = Q K^T of the tile: all 64 rows over all 512 dims in one chain of 32 wgmma m64n64k16 (A =
    // Q, B = K rows, both K-major) in the math warpgroup; running descriptors (laundered each step:
    // all 32 precomputed would take 64 registers).
    // One chain rather than S split over both consumer warpgroups: two chains contend for the same
    // tensor and shared-memory pipes, and handing the PV warpgroup's fp32 partial over would sit on
    // the math warpgroup's critical path (docs/benchmarks.md has the measurements).
    // Issued and committed; wait<0> ends it. The first step ignores the accumulators (scale-d 0),
    // so they are not zeroed per tile.
    auto s_issue = [&](float (&sp)[32], const std::uint8_t* Kt) {
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
    };
    // The side that hands a buffer over waits too (barrier.sync, not barrier.arrive): with an
    // arrive, compute-sanitizer racecheck reports hazards on the rescale factors (As) handed from
    // the math warpgroup to the PV warpgroup; both sides waiting costs no measurable time.
    auto handoff = [&](int bar) { bar_sync(bar, kWsConsumers); };
    // O *= the rescale factors of the thread's two heads (both consumer warpgroups, each tile).
    // (Skipping it for warps whose factors are all exactly 1 gains nothing.)
    auto rescale_o = [&](float a0, float a1) {
#pragma unroll
      for (int nb = 0; nb < 32; ++nb) {
        o[4 * nb + 0] *= a0;
        o[4 * nb + 1] *= a0;
        o[4 * nb + 2] *= a1;
        o[4 * nb + 3] *= a1;
      }
    };
    if (c == 0) {
      // ---- math warpgroup: S, softmax, P -> PV warpgroup, O[:, 0 .. 255]
      // P (head h, tile row k) lives at (h / 8) kWsPSbo + (k / 8) 128 + (h % 8) 16 + (k % 8) 2: the
      // thread's pair (hrow[jj], 8 nb + qc) at pst + jj kWsPSbo + 128 nb (a warp's 4-byte stores
      // fall in 32 distinct banks).
      std::uint8_t* pst = Ps + 2 * w4 * kWsPSbo + qr * 16 + qc * 2;
      float s[32];
#pragma unroll
      for (int e = 0; e < 32; ++e) s[e] = 0.f;  // defined once; each chain overwrites them
      for (int j = 0; j < n; ++j) {
        const int st = j & 1;
        bar_sync(kBarFull0 + st, kWsThreads);
        probe.stamp(tl::full + (j & 7), tid == 0);
        const std::uint8_t* Kt = Ks + st * kWgKBytes;
        // Valid-row bits of the thread's 16 score columns (8 nb + qc + e1: bit 2 nb + e1), read
        // before the MMAs so their latency hides behind S.
        unsigned vmask = 0;
#pragma unroll
        for (int nb = 0; nb < 8; ++nb)
#pragma unroll
          for (int e1 = 0; e1 < 2; ++e1) vmask |= (vld[st * 64 + nb * 8 + qc + e1] != 0 ? 1u : 0u) << (2 * nb + e1);
        s_issue(s, Kt);
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
        As[ct] = make_float2(alpha[0], alpha[1]);
        handoff(kBarPReady);
        rescale_o(alpha[0], alpha[1]);
        probe.stamp(tl::c_pv_start + (j & 3), tid == 0 && j < 4);
        {
          // O[:, 0 .. 255] += P V (4 x wgmma m64n256k16, A = P from registers, B = the K tile read
          // MN-major).
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
      MLs[ct] = make_float4(m[0], m[1], l[0], l[1]);
      bar_sync(kBarQ, kWsConsumers);
    } else {
      // ---- PV warpgroup: O[:, 256 .. 511] += P V, P and the rescale factors from the math warpgroup
      const std::uint64_t p_desc = wgmma_desc(Ps, 128, kWsPSbo);
      for (int j = 0; j < n; ++j) {
        const int st = j & 1;
        bar_sync(kBarFull0 + st, kWsThreads);
        const std::uint8_t* Kt = Ks + st * kWgKBytes;
        handoff(kBarPFree);  // this warpgroup's PV of tile j - 1 is done
        bar_sync(kBarPReady, kWsConsumers);
        const float2 a = As[ct];
        rescale_o(a.x, a.y);
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
      const float4 ml = MLs[ct];
      m[0] = ml.x;
      m[1] = ml.y;
      l[0] = ml.z;
      l[1] = ml.w;
    }
    probe.stamp(tl::loop_end, tid == 0);
  }

  if (p.cluster) {
    cluster_merge(p, smem, probe, o, m, l, b, head0, tid, lane, c, w4, qc, hrow);
    return;
  }
  store_result(p, o, m, l, b, head0, part, lane, c, qc, hrow);
}

}  // namespace graphsafe::ds4::cuda::attention
