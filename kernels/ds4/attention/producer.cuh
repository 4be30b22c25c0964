// DS4 sparse attention, warp-specialized kernel: the producer warpgroup's tile loop. It fills the
// two K stages (WsSmem::tiles.k) with the CTA's tiles t_begin .. t_end - 1 as bf16 rows in the
// canonical no-swizzle layout, marks each row valid or not (vld), and hands each stage to the
// consumers (FULL) once the consumers have released it (EMPTY). Paged rows: fp8 data + ue8m0
// scales from the paged caches, dequantized on the way; workspace rows: bf16 copied as they are.
// Rows past the request's length or with an invalid slot become zero rows (vld 0).
#pragma once

#include "config.cuh"
#include "params.cuh"
#include "probe.cuh"

namespace graphsafe::ds4::cuda::attention {

// The paged producer's stand-in for rows it does not load from a cache (invalid slots, rows past
// the request's length): 576 zero data bytes and zero scales, so such rows dequantize to zeros.
namespace {
__device__ __align__(16) std::uint8_t g_zero_row[kRawStride];
}

// One producer thread (ptid = its index in the warpgroup) of request b's CTA. slot_of(t, row, nc,
// TT, te): the slot of row `row` of tile t (ws_kernel); sl_full: the slots of this thread's rows
// of the first three tiles as fetched for a full-width request (nc_full compressed, T_full
// attended rows), refetched here when the request is shorter.
template <bool kPaged, class Probe, class SlotOf>
__device__ __forceinline__ void produce_tiles(const Params& p, std::uint8_t* Ks, int* vld, Probe& probe,
                                              const SlotOf& slot_of, int ptid, int r0, int (&sl_full)[3][2],
                                              int nc_full, int T_full, int n_cmp, int T, int t_begin, int t_end,
                                              int n) {
  // Thread (producer warp pw, lane l) owns rows r0 = 16 pw + l % 8 (row A) and r0 + 8 (row B) of
  // every tile and their 16-byte chunks q + 4m (q = l / 8). It fetches its rows' slots and
  // computes their addresses itself (4 threads share a row: redundant index loads hit L1), so no
  // row pointers go through shared memory and no producer-wide barrier sits in the loop. Every
  // chunk's global offset and shared-memory offset is a compile-time constant from two bases. A
  // warp's load covers 8 rows x 64 contiguous bytes, and each 8-lane phase of a
  // 128-bit shared store covers 8 consecutive rows of one core-matrix column (conflict-free).
  // Paged rows are software-pipelined across tiles: a row's registers are refilled with the same
  // row of the next tile as soon as that row is stored, so the next tile's loads are in flight
  // while this tile is dequantized, stored and published and while the producer waits for the
  // next stage (issued after the stores, they put one L2 latency per tile on the critical path).
  const int q = (ptid >> 3) & 3;
  auto fetch_slot = [&](int t, int row) { return slot_of(t, row, n_cmp, T, t_end); };
  // Slots of tiles t (sl0), t + 1 (sl1), t + 2 (sl2) and t + 3 (sl3, fetched at the top of an
  // iteration). The L2 prefetch of tile t + 2 after the FULL arrive reads slots fetched one
  // iteration earlier (about one index-load latency: prefetching from slots fetched in the same
  // iteration would wait for them), so a tile's own loads are L2 hits. The index load is one predicated
  // instruction (ld_nc_or) so that nothing waits for it before that first read.
  // The first three come from the kernel prologue's full-width fetch when the request is at full
  // width (then t_begin, t_end and every row's source are the same).
  if (n_cmp != nc_full || T != T_full) {
#pragma unroll
    for (int k = 0; k < 3; ++k)
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) sl_full[k][rr] = fetch_slot(t_begin + k, r0 + 8 * rr);
  }
  int sl0[2], sl1[2], sl2[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    sl0[rr] = sl_full[0][rr];
    sl1[rr] = sl_full[1][rr];
    sl2[rr] = sl_full[2][rr];
  }
  [[maybe_unused]] const bool tl0 = ptid == 0;
  if constexpr (kPaged) {
    // fp8 chunk c = q + 4m (m < 7): scale byte m, bf16 chunks 2c, 2c + 1 -> kr + 256 q + 1024 m
    // (+ 128). Rope chunk c = 28 + q + 4m' (m' < 2): bf16 chunk 56 + q + 4m' -> kr + 7168 +
    // 128 q + 512 m'. w[rr] / sc[rr] hold row rr's 9 chunks and scales of the tile being stored.
    uint4 w[2][9];
    uint2 sc[2];
    // Addresses of a row of tile t: the cache row, or the zero row (an invalid slot, a row past
    // T or past t_end). The loads are then unconditional: no zeroing of w[] and no
    // branch per row.
    const std::uint8_t* const zero = g_zero_row;
    auto row_addr = [&](int t, int row, int slot, const std::uint8_t*& d, const std::uint8_t*& scp) {
      const CacheView& cv = t * kTileRows + row < n_cmp ? p.cmp : p.swa;
      d = zero;
      scp = zero + kTokenDataBytes;
      if (cv.valid(slot)) cv.locate(slot, d, scp);
    };
    auto issue_row = [&](int rr, const std::uint8_t* d, const std::uint8_t* scp) {  // row rr's loads into w[rr]
      const uint4* src = reinterpret_cast<const uint4*>(d) + q;
#pragma unroll
      for (int mm = 0; mm < 9; ++mm) w[rr][mm] = __ldg(src + 4 * mm);
      sc[rr] = __ldg(reinterpret_cast<const uint2*>(scp));  // 7 scales + pad
    };
    auto prefetch_row = [&](const std::uint8_t* d, const std::uint8_t* scp) {  // this thread's quarter
      if (d == zero) return;
      asm volatile("prefetch.global.L2 [%0];" ::"l"(d + q * 128));
      asm volatile("prefetch.global.L2 [%0];" ::"l"(q == 0 ? d + 512 : scp));
    };
    auto store_row = [&](std::uint8_t* kr, int rr) {  // dequantize w[rr] into the stage
      std::uint8_t* kf = kr + rr * kWgRowSbo + 256 * q;
      const uint2 sr = sc[rr];
      // Rows with a scale byte >= 128 (never real KV scales) take the general dequant16 (a
      // branch, not hot-path code); both loops unrolled: a rolled one would index w[] dynamically.
      if (((sr.x | sr.y) & 0x80808080u) == 0) {
#pragma unroll
        for (int mm = 0; mm < 7; ++mm) {
          uint4 lo, hi;
          dequant16_small(w[rr][mm], ue8m0_factor(((mm < 4 ? sr.x : sr.y) >> (8 * (mm & 3))) & 0xFFu), lo, hi);
          *reinterpret_cast<uint4*>(kf + 1024 * mm) = lo;
          *reinterpret_cast<uint4*>(kf + 1024 * mm + 128) = hi;
        }
      } else {
#pragma unroll
        for (int mm = 0; mm < 7; ++mm) {
          uint4 lo, hi;
          dequant16(w[rr][mm], ((mm < 4 ? sr.x : sr.y) >> (8 * (mm & 3))) & 0xFFu, lo, hi);
          *reinterpret_cast<uint4*>(kf + 1024 * mm) = lo;
          *reinterpret_cast<uint4*>(kf + 1024 * mm + 128) = hi;
        }
      }
      std::uint8_t* kp = kr + rr * kWgRowSbo + 56 * 128 + 128 * q;
      *reinterpret_cast<uint4*>(kp) = w[rr][7];
      *reinterpret_cast<uint4*>(kp + 512) = w[rr][8];
    };
    // Each row is located once, when its L2 prefetch is issued (one tile ahead of its loads);
    // pd / ps keep the addresses of tile t + 1's rows until their loads are issued.
    const std::uint8_t *pd[2], *ps[2];
    bool ok[2];  // rows of the tile in w[] are cache rows (vld)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      row_addr(t_begin, r0 + 8 * rr, sl0[rr], pd[rr], ps[rr]);
      ok[rr] = pd[rr] != zero;
      issue_row(rr, pd[rr], ps[rr]);
    }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      row_addr(t_begin + 1, r0 + 8 * rr, sl1[rr], pd[rr], ps[rr]);
      prefetch_row(pd[rr], ps[rr]);
    }
    for (int j = 0; j < n; ++j) {
      const int t = t_begin + j, st = j & 1;
      int sl3[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) sl3[rr] = fetch_slot(t + 3, r0 + 8 * rr);
      std::uint8_t* kr = Ks + st * kWgKBytes + (r0 >> 3) * kWgRowSbo + (r0 & 7) * 16;
      probe.stamp(tl::p_loads_start + (j & 7), tl0);
      if (j >= 2) bar_sync(kBarEmpty0 + st, kWsThreads);  // consumers are done with tile t-2
      probe.stamp(tl::p_empty_ok + (j & 7), tl0);
      if (q == 0) {
        vld[st * 64 + r0] = ok[0] ? 1 : 0;
        vld[st * 64 + r0 + 8] = ok[1] ? 1 : 0;
      }
      probe.stamp_after(tl::p_loads_issued + (j & 7), tl0, w[0][8].w);
      store_row(kr, 0);
      ok[0] = pd[0] != zero;
      issue_row(0, pd[0], ps[0]);  // row A of the next tile (the zero row past t_end)
      store_row(kr, 1);
      probe.stamp(tl::p_stores_done + (j & 7), tl0);
      fence_proxy_async();
      probe.stamp(tl::p_full_arrive + (j & 7), tl0);
      bar_arrive(kBarFull0 + st, kWsThreads);
      ok[1] = pd[1] != zero;
      issue_row(1, pd[1], ps[1]);  // row B of the next tile
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        row_addr(t + 2, r0 + 8 * rr, sl2[rr], pd[rr], ps[rr]);
        prefetch_row(pd[rr], ps[rr]);
      }
      probe.stamp(tl::p_prefetched + (j & 7), tl0);
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) sl2[rr] = sl3[rr];
    }
  } else {
    // Workspace rows (bf16): chunk c = q + 4m (m < 16) -> kr + 128 q + 512 m; 16 loads per row,
    // the first row's issued before the stage wait (both rows' would take 128 registers).
    auto row_ptr = [&](long long slot) -> const std::uint8_t* {  // null: invalid row or no tile -> zeros
      if (slot < 0 || slot >= p.ws_rows) return nullptr;
      return reinterpret_cast<const std::uint8_t*>(p.ws + slot * kHeadDim);
    };
    // L2 prefetch of this thread's quarter of its two rows (the 4 threads of a row split its lines).
    auto l2_prefetch = [&](const int* slot) {
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const std::uint8_t* d = row_ptr(slot[rr]);
        if (d == nullptr) continue;
        asm volatile("prefetch.global.L2 [%0];" ::"l"(d + q * 128));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(d + 512 + q * 128));
      }
    };
    l2_prefetch(sl1);
    for (int j = 0; j < n; ++j) {
      const int t = t_begin + j, st = j & 1;
      int sl3[2];
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) sl3[rr] = fetch_slot(t + 3, r0 + 8 * rr);
      const std::uint8_t* d[2] = {row_ptr(sl0[0]), row_ptr(sl0[1])};
      std::uint8_t* kr = Ks + st * kWgKBytes + (r0 >> 3) * kWgRowSbo + (r0 & 7) * 16;
      probe.stamp(tl::p_loads_start + (j & 7), tl0);
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        const uint4* src = reinterpret_cast<const uint4*>(d[rr]) + q;
        uint4 v[16];
#pragma unroll
        for (int mm = 0; mm < 16; ++mm) v[mm] = d[rr] != nullptr ? __ldg(src + 4 * mm) : make_uint4(0, 0, 0, 0);
        if (rr == 0) {
          if (j >= 2) bar_sync(kBarEmpty0 + st, kWsThreads);  // consumers are done with tile t-2
          probe.stamp(tl::p_empty_ok + (j & 7), tl0);
          if (q == 0) {
            vld[st * 64 + r0] = d[0] != nullptr ? 1 : 0;
            vld[st * 64 + r0 + 8] = d[1] != nullptr ? 1 : 0;
          }
        }
#pragma unroll
        for (int mm = 0; mm < 16; ++mm) *reinterpret_cast<uint4*>(kr + rr * kWgRowSbo + 128 * q + 512 * mm) = v[mm];
      }
      probe.stamp(tl::p_stores_done + (j & 7), tl0);
      fence_proxy_async();
      probe.stamp(tl::p_full_arrive + (j & 7), tl0);
      bar_arrive(kBarFull0 + st, kWsThreads);
      l2_prefetch(sl2);
      probe.stamp(tl::p_prefetched + (j & 7), tl0);
#pragma unroll
      for (int rr = 0; rr < 2; ++rr) {
        sl0[rr] = sl1[rr];
        sl1[rr] = sl2[rr];
        sl2[rr] = sl3[rr];
      }
    }
  }
}

}  // namespace graphsafe::ds4::cuda::attention
