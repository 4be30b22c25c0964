// DS4 sparse attention, warp-specialized kernel (sm_90a), 384 threads = 3 warpgroups: the producer
// (producer.cuh) fills a double-buffered bf16 K tile, the math and PV warpgroups (consumer.cuh)
// compute S, the online softmax and O += P V; then the splits merge in the cluster (merge.cuh) or
// the partials go to the scratch (store_unmerged).
//
// One CTA = (split, request b, group of 64 heads): grid (splits, B, H / 64).
#pragma once

#include "config.cuh"
#include "consumer.cuh"
#include "merge.cuh"
#include "params.cuh"
#include "probe.cuh"
#include "producer.cuh"

namespace graphsafe::ds4::cuda::attention {

template <bool kPaged, class Probe>
__global__ void __launch_bounds__(kWsThreads, 1) ws_kernel(const Params p) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  const WsSmemPtrs sm = ws_smem(smem);  // each role derives the same pointers itself

  const int split = blockIdx.x, b = blockIdx.y, head0 = blockIdx.z * kGroupHeads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

  // Programmatic dependent launch (launch.cuh sets the attribute): this grid may start while the
  // previous kernel of the stream is still running; every global read below waits for it to finish
  // and flush here. Then the next kernel may be launched: its CTAs take the SMs ours free and run
  // up to their own wait, which hides the launch gap between back-to-back kernels. Both are no-ops
  // without the attribute.
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
  // Queries first (consumer threads): their loads do not depend on the lengths, so they overlap
  // the length and index loads instead of following them. Consumer warp cw loads heads 8 cw +
  // lane % 8, 16-byte chunks lane / 8 + 4 i; stored into the canonical layout once the consumers
  // own their registers. Plain loads + st.shared, no cp.async: every shared-memory write of this
  // kernel is an ordinary store, which compute-sanitizer racecheck orders across the cluster
  // barriers.
  const int qh = warp * 8 + (lane & 7);
  uint4 qv[16];
  if (tid < kWsConsumers) {
    const std::uint16_t* qrow = p.q + (static_cast<long long>(b) * p.H + head0 + qh) * kHeadDim;
#pragma unroll
    for (int i = 0; i < 16; ++i) qv[i] = __ldg(reinterpret_cast<const uint4*>(qrow + ((lane >> 3) + 4 * i) * 8));
  }
  // Producer thread ptid owns rows r0 and r0 + 8 of every tile (producer.cuh). Before the lengths
  // are in, it fetches its slots of the split's first three tiles as if the request were at full
  // width (every compressed and window slot attended: any request longer than the window and, at
  // C4, 4 x top-k tokens), so that these index loads overlap the length loads (lengths -> indices
  // -> rows would be three dependent round trips before the first tile). The producer checks them
  // against the lengths; a request below full width fetches again.
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
      for (int rr = 0; rr < 2; ++rr) sl_full[k][rr] = slot_of<kPaged>(p, b, tb_full + k, r0 + 8 * rr, nc_full, T_full, te_full);
  }
  Probe probe;
  probe.begin();
  TileSpan ts;
  ts.n_cmp = 0;
  ts.T = 0;
  if constexpr (kPaged) {
    if (p.cmp_idx != nullptr) ts.n_cmp = min(max(p.cmp_lens[b], 0), p.cmp_width);
    ts.T = ts.n_cmp + min(max(p.swa_lens[b], 0), p.swa_width);
  } else {
    ts.T = min(max(p.lens[b], 0), p.width);
  }
  const int ntiles = (ts.T + kTileRows - 1) / kTileRows;
  const int tps = (ntiles + p.splits - 1) / p.splits;
  ts.t_begin = split * tps;
  ts.t_end = min(ntiles, ts.t_begin + tps);
  ts.n = max(0, ts.t_end - ts.t_begin);
  const int n = ts.n;
  probe.tiles(n);
  const long long part = (static_cast<long long>(b) * p.splits + split) * p.H + head0;

  if (n == 0 && !p.cluster) {  // nothing to attend in this split
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
    setmaxnreg_dec<kWsProducerRegs>();  // gives the consumers their 2 x (consumer - launch) x 128
    ws_producer<kPaged>(p, b, ts, ptid, r0, nc_full, T_full, sl_full, probe);
    if (p.cluster) merge_producer_barriers();
    return;
  }
  {
    setmaxnreg_inc<kWsConsumerRegs>();
    if (n > 0) {
      probe.stamp_after(tl::q_landed, tid == 0, qv[15].w);
#pragma unroll
      for (int i = 0; i < 16; ++i) *reinterpret_cast<uint4*>(sm.q + blk16(qh, (lane >> 3) + 4 * i)) = qv[i];
      fence_proxy_async();
      bar_sync(kBarQ, kWsConsumers);
      probe.stamp(tl::q_ready, tid == 0);
    }
#pragma unroll
    for (int e = 0; e < 128; ++e) o[e] = 0.f;
    const int ct = tid & 127;  // thread index within the consumer warpgroup
    if (c == 0)
      math_warpgroup(p, n, o, m, l, w4, qr, qc, ct, tid, probe);
    else
      pv_warpgroup(n, o, m, l, ct);
    probe.stamp(tl::loop_end, tid == 0);
  }

  if (p.cluster) {
    cluster_merge(p, b, head0, o, m, l, hrow, c, w4, lane, qc, tid, probe);
    return;
  }
  store_unmerged(p, b, head0, part, o, m, l, hrow, c, lane, qc);
}

}  // namespace graphsafe::ds4::cuda::attention
