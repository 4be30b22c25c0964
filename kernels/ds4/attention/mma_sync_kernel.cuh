// DS4 sparse attention, portable tile engine: mma.sync m16n8k16 + ldmatrix (SASS: HMMA), 512
// threads, no warp specialization; runs on GPUs without sm_90a (AttentionEngine::mma_sync; the
// attention tests run through it too). Per tile: all warps cp.async the tile's rows
// (paged: fp8 + scales into a raw stage, dequantized into the bf16 K tile by all threads), then
// warp w computes S for heads 16 (w % 4).., rows 16 (w / 4).., the online softmax over the tile
// (row maxima and sums reduced through shared memory) and O for heads 32 (w / 8).., dims
// 64 (w % 8)...
#pragma once

#include "config.cuh"
#include "params.cuh"

namespace graphsafe::ds4::cuda::attention {

template <bool kPaged>
__global__ void __launch_bounds__(kThreads, 1) mma_sync_kernel(const Params p) {
  extern __shared__ __align__(128) std::uint8_t smem[];
  using Plan = MmaSmem<kPaged>;
  std::uint16_t* Qs = reinterpret_cast<std::uint16_t*>(smem + offsetof(Plan, q));
  std::uint16_t* Ks = reinterpret_cast<std::uint16_t*>(smem + offsetof(Plan, k));
  std::uint16_t* Ps = reinterpret_cast<std::uint16_t*>(smem + offsetof(Plan, p));
  std::uint8_t* Raw = smem + offsetof(Plan, p) + kPBytes;  // paged only: Plan::raw
  float* red = reinterpret_cast<float*>(smem + offsetof(Plan, misc));  // [4][64]
  float* lsum = red + kRowGroups * 64;                                // [4][64]
  int* vld = reinterpret_cast<int*>(lsum + kRowGroups * 64);          // [2][64]

  const int split = blockIdx.x, b = blockIdx.y, head0 = blockIdx.z * kGroupHeads;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

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
  const long long part = (static_cast<long long>(b) * p.splits + split) * p.H + head0;

  if (t_begin >= t_end) {  // nothing to attend in this split
    if (p.splits == 1) {
      uint4* o = reinterpret_cast<uint4*>(p.out + (static_cast<long long>(b) * p.H + head0) * kHeadDim);
      for (int i = tid; i < kGroupHeads * kHeadDim / 8; i += kThreads) o[i] = make_uint4(0, 0, 0, 0);
    } else if (tid < kGroupHeads) {
      p.part_ml[(part + tid) * 2 + 0] = -INFINITY;
      p.part_ml[(part + tid) * 2 + 1] = 0.f;
    }
    return;
  }

  // ---- queries: 64 heads x 64 chunks of 16 B
  {
    const std::uint16_t* qg = p.q + (static_cast<long long>(b) * p.H + head0) * kHeadDim;
    for (int c = tid; c < kGroupHeads * 64; c += kThreads) {
      const int r = c >> 6, ch = c & 63;
      cp_async16(Qs + r * kQStride + ch * 8, qg + r * kHeadDim + ch * 8, true);
    }
  }

  // ---- tile loader: warp w loads rows 4w .. 4w+3 of tile t into stage st
  auto issue_tile = [&](int t, int st) {
    const int r = warp * 4 + (lane & 3);
    const int i = t * kTileRows + r;
    bool valid = false;
    if constexpr (kPaged) {
      const std::uint8_t* dptr = p.swa.base;
      const std::uint8_t* sptr = p.swa.base;
      if (i < n_cmp) {
        const long long slot = p.cmp_idx[static_cast<long long>(b) * p.cmp_width + i];
        valid = p.cmp.valid(slot);
        if (valid) { dptr = p.cmp.data(slot); sptr = p.cmp.scales(slot); }
      } else if (i < T) {
        const long long slot = p.swa_idx[static_cast<long long>(b) * p.swa_width + (i - n_cmp)];
        valid = p.swa.valid(slot);
        if (valid) { dptr = p.swa.data(slot); sptr = p.swa.scales(slot); }
      }
      if (lane < 4) vld[st * 64 + r] = valid ? 1 : 0;
      std::uint8_t* raw = Raw + st * kRawBytes;
#pragma unroll
      for (int rr = 0; rr < 4; ++rr) {
        const std::uint8_t* d = reinterpret_cast<const std::uint8_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(dptr), rr));
        const std::uint8_t* s = reinterpret_cast<const std::uint8_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(sptr), rr));
        const bool v = __shfl_sync(0xffffffffu, valid ? 1 : 0, rr) != 0;
        std::uint8_t* dst = raw + (warp * 4 + rr) * kRawStride;
        cp_async16(dst + lane * 16, d + lane * 16, v);
        if (lane < 4) cp_async16(dst + (32 + lane) * 16, d + (32 + lane) * 16, v);
        else if (lane == 4) cp_async8(dst + kTokenDataBytes, s, v);
      }
    } else {
      const std::uint16_t* src = p.ws;
      if (i < T) {
        const long long ix = p.idx[static_cast<long long>(b) * p.width + i];
        valid = ix >= 0 && ix < p.ws_rows;
        if (valid) src = p.ws + ix * kHeadDim;
      }
      if (lane < 4) vld[st * 64 + r] = valid ? 1 : 0;
      std::uint16_t* kt = Ks + st * (kTileRows * kQStride);
#pragma unroll
      for (int rr = 0; rr < 4; ++rr) {
        const std::uint16_t* s = reinterpret_cast<const std::uint16_t*>(
            __shfl_sync(0xffffffffu, reinterpret_cast<unsigned long long>(src), rr));
        const bool v = __shfl_sync(0xffffffffu, valid ? 1 : 0, rr) != 0;
        std::uint16_t* dst = kt + (warp * 4 + rr) * kQStride;
        cp_async16(dst + lane * 8, s + lane * 8, v);
        cp_async16(dst + (lane + 32) * 8, s + (lane + 32) * 8, v);
      }
    }
  };

  issue_tile(t_begin, 0);
  cp_async_commit();

  const int sh = (warp & 3) * 16;   // S: heads sh .. sh+15
  const int rg = warp >> 2;         // S: row group, tile rows sr .. sr+15
  const int sr = rg * 16;
  const int ph = (warp >> 3) * 32;  // PV: heads ph .. ph+31
  const int pd = (warp & 7) * 64;   // PV: dims pd .. pd+63
  const int qr = lane >> 2, qc = 2 * (lane & 3);

  float m_s[2] = {-INFINITY, -INFINITY}, l_s[2] = {0.f, 0.f};
  float m_pv[4] = {-INFINITY, -INFINITY, -INFINITY, -INFINITY};
  float o[2][8][4];
#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) o[a][n][e] = 0.f;

  for (int t = t_begin; t < t_end; ++t) {
    const int st = (t - t_begin) & 1;
    cp_async_wait<0>();
    __syncthreads();  // tile t landed everywhere; every warp is done with tile t-1
    if (t + 1 < t_end) {
      issue_tile(t + 1, st ^ 1);
      cp_async_commit();
    }
    const std::uint16_t* Kt;
    if constexpr (kPaged) {
      const std::uint8_t* raw = Raw + st * kRawBytes;
#pragma unroll 1
      for (int item = tid; item < kTileRows * 36; item += kThreads) {
        const int r = item / 36, c = item - r * 36;
        const uint4 w = *reinterpret_cast<const uint4*>(raw + r * kRawStride + c * 16);
        if (c < 28) {
          uint4 lo, hi;
          dequant16(w, raw[r * kRawStride + kTokenDataBytes + (c >> 2)], lo, hi);
          uint4* dst = reinterpret_cast<uint4*>(Ks + r * kQStride + c * 16);
          dst[0] = lo;
          dst[1] = hi;
        } else {
          *reinterpret_cast<uint4*>(Ks + r * kQStride + kNopeDim + (c - 28) * 8) = w;
        }
      }
      __syncthreads();
      Kt = Ks;
    } else {
      Kt = Ks + st * (kTileRows * kQStride);
    }
    const int* vt = vld + st * 64;

    // ---- S = Q K^T for heads sh.., rows sr..
    float sacc[2][4];
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) sacc[n][e] = 0.f;
    {
      const std::uint16_t* qa = Qs + (sh + (lane & 15)) * kQStride + (lane >> 4) * 8;
      const std::uint16_t* kb = Kt + (sr + (lane & 7) + ((lane >> 4) << 3)) * kQStride + ((lane >> 3) & 1) * 8;
#pragma unroll 4
      for (int kk = 0; kk < kHeadDim / 16; ++kk) {
        std::uint32_t a[4], b0[4];
        ldmatrix_x4(a, qa + kk * 16);
        ldmatrix_x4(b0, kb + kk * 16);
        mma_bf16(sacc[0], a, b0[0], b0[1]);
        mma_bf16(sacc[1], a, b0[2], b0[3]);
      }
    }
    float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 2; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int col = sr + n * 8 + qc + (e & 1);
        const float s = vt[col] ? sacc[n][e] * p.scale_log2 : -INFINITY;
        sacc[n][e] = s;
        mx[e >> 1] = fmaxf(mx[e >> 1], s);
      }
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 1));
      mx[j] = fmaxf(mx[j], __shfl_xor_sync(0xffffffffu, mx[j], 2));
    }
    if ((lane & 3) == 0) {
      red[rg * 64 + sh + qr] = mx[0];
      red[rg * 64 + sh + qr + 8] = mx[1];
    }
    __syncthreads();

    // ---- softmax numerators -> P (bf16, smem); running sums
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = sh + qr + 8 * j;
      const float mn = fmaxf(m_s[j], fmaxf(fmaxf(red[h], red[64 + h]), fmaxf(red[128 + h], red[192 + h])));
      const float mu = mn == -INFINITY ? 0.f : mn;
      l_s[j] *= exp2f(m_s[j] - mu);
      m_s[j] = mn;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < 2; ++n) {
        const float p0 = exp2f(sacc[n][2 * j] - mu), p1 = exp2f(sacc[n][2 * j + 1] - mu);
        sum += p0 + p1;
        *reinterpret_cast<std::uint32_t*>(Ps + h * kPStride + sr + n * 8 + qc) = pack_bf16x2(p0, p1);
      }
      l_s[j] += sum;
    }
    // ---- rescale O for the PV rows
#pragma unroll
    for (int a = 0; a < 2; ++a)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int h = ph + a * 16 + qr + 8 * j;
        const float mn = fmaxf(m_pv[2 * a + j], fmaxf(fmaxf(red[h], red[64 + h]), fmaxf(red[128 + h], red[192 + h])));
        const float mu = mn == -INFINITY ? 0.f : mn;
        const float alpha = exp2f(m_pv[2 * a + j] - mu);
        m_pv[2 * a + j] = mn;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
          o[a][n][2 * j] *= alpha;
          o[a][n][2 * j + 1] *= alpha;
        }
      }
    __syncthreads();

    // ---- O += P V
#pragma unroll
    for (int ks = 0; ks < kTileRows / 16; ++ks) {
      std::uint32_t a0[4], a1[4];
      ldmatrix_x4(a0, Ps + (ph + (lane & 15)) * kPStride + ks * 16 + (lane >> 4) * 8);
      ldmatrix_x4(a1, Ps + (ph + 16 + (lane & 15)) * kPStride + ks * 16 + (lane >> 4) * 8);
      const std::uint16_t* vb = Kt + (ks * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * kQStride + pd + (lane >> 4) * 8;
#pragma unroll
      for (int np = 0; np < 4; ++np) {
        std::uint32_t bb[4];
        ldmatrix_x4_trans(bb, vb + np * 16);
        mma_bf16(o[0][2 * np], a0, bb[0], bb[1]);
        mma_bf16(o[0][2 * np + 1], a0, bb[2], bb[3]);
        mma_bf16(o[1][2 * np], a1, bb[0], bb[1]);
        mma_bf16(o[1][2 * np + 1], a1, bb[2], bb[3]);
      }
    }
  }

  // ---- row sums of the S warps -> smem
#pragma unroll
  for (int j = 0; j < 2; ++j) {
    float l = l_s[j];
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    if ((lane & 3) == 0) lsum[rg * 64 + sh + qr + 8 * j] = l;
  }
  __syncthreads();

#pragma unroll
  for (int a = 0; a < 2; ++a)
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      const int h = ph + a * 16 + qr + 8 * j;
      const float l = (lsum[h] + lsum[64 + h]) + (lsum[128 + h] + lsum[192 + h]);
      const float m = m_pv[2 * a + j];
      if (p.splits == 1) {
        float inv = 0.f;
        if (l > 0.f) {
          const float sterm = p.sink != nullptr ? exp2f(p.sink[head0 + h] * kLog2e - m) : 0.f;
          inv = 1.f / (l + sterm);
        }
        std::uint16_t* orow = p.out + (static_cast<long long>(b) * p.H + head0 + h) * kHeadDim + pd + qc;
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *reinterpret_cast<std::uint32_t*>(orow + n * 8) =
              pack_bf16x2(o[a][n][2 * j] * inv, o[a][n][2 * j + 1] * inv);
      } else {
        float* orow = p.part_o + (part + h) * kHeadDim + pd + qc;
#pragma unroll
        for (int n = 0; n < 8; ++n)
          *reinterpret_cast<float2*>(orow + n * 8) = make_float2(o[a][n][2 * j], o[a][n][2 * j + 1]);
        if ((warp & 7) == 0 && (lane & 3) == 0) {
          p.part_ml[(part + h) * 2 + 0] = m;
          p.part_ml[(part + h) * 2 + 1] = l;
        }
      }
    }
}

}  // namespace graphsafe::ds4::cuda::attention
