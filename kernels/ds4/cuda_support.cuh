// Internal helpers shared by the DS4 kernels: error checks, cp.async / ldmatrix / mma wrappers,
// fp8_ds_mla addressing. Not installed.
#pragma once

#include <graphsafe/ds4/layout.hpp>

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <stdexcept>
#include <string>

namespace graphsafe::ds4::cuda::detail {

inline void check_launch(const char* kernel) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("graphsafe::ds4: launch of ") + kernel + " failed: " +
                             cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}
inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw std::runtime_error(std::string("graphsafe::ds4: ") + what + " failed: " +
                             cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}
[[noreturn]] inline void bad_arg(const std::string& fn, const std::string& what, long long value,
                                 const std::string& allowed) {
  throw std::invalid_argument("graphsafe::ds4::cuda::" + fn + ": " + what + " = " +
                              std::to_string(value) + " is not allowed; allowed: " + allowed);
}
inline void require_ptr(const std::string& fn, const char* name, const void* p) {
  if (p == nullptr)
    throw std::invalid_argument("graphsafe::ds4::cuda::" + fn + ": " + name +
                                " is null; a device pointer is required");
}
inline void require_heads(const std::string& fn, int h) {
  if (h != 64 && h != 128) bad_arg(fn, "heads (H)", h, "64 or 128 (FlashMLA's padded head counts)");
}
inline void require_batch(const std::string& fn, int b) {
  if (b <= 0) bad_arg(fn, "batch (B)", b, "B >= 1");
}
inline void require_ratio(const std::string& fn, int r) {
  if (r != 1 && r != 4 && r != 128) bad_arg(fn, "ratio", r, "1 (C1), 4 (C4) or 128 (C128)");
}
inline void require_cache(const std::string& fn, const char* name, const PagedCache& c) {
  require_ptr(fn, name, c.base);
  if (c.block_tokens <= 0) bad_arg(fn, std::string(name) + ".block_tokens", c.block_tokens, ">= 1");
  if (c.stride < static_cast<std::size_t>(c.block_tokens) * kTokenBytes || c.stride % 16 != 0)
    bad_arg(fn, std::string(name) + ".stride", static_cast<long long>(c.stride),
            "a multiple of 16 bytes >= block_tokens * 584 (layout.hpp block_stride_bytes)");
  if (reinterpret_cast<std::uintptr_t>(c.base) % 16 != 0)
    bad_arg(fn, std::string(name) + ".base % 16", static_cast<long long>(
            reinterpret_cast<std::uintptr_t>(c.base) % 16), "0 (16-byte aligned)");
}

// ---------------------------------------------------------------------------------------- device
__device__ __forceinline__ std::uint32_t smem_u32(const void* p) {
  return static_cast<std::uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(n));
}
__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, bool valid) {
  const int n = valid ? 8 : 0;
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_u32(smem)), "l"(gmem),
               "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(std::uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_u32(p)));
}
// D += A(16x16 bf16, row) * B(16x8 bf16, col), fp32 accumulate.
__device__ __forceinline__ void mma_bf16(float (&d)[4], const std::uint32_t (&a)[4], std::uint32_t b0,
                                         std::uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ std::uint32_t pack_bf16x2(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<std::uint32_t*>(&v);
}

// UE8M0 byte -> 2^(byte-127) (byte 0 -> 0, never produced by the quantizer: amax >= 1e-4).
__device__ __forceinline__ float ue8m0_to_float(unsigned byte) { return __uint_as_float(byte << 23); }

// 4 fp8 e4m3 (one 32-bit word) * scale -> 4 bf16 (two 32-bit words). Exact: e4m3 -> f16 is exact,
// times a power of two is exact in fp32, and 4 significant bits fit bf16.
__device__ __forceinline__ void dequant4(std::uint32_t w, float scale, std::uint32_t& lo,
                                         std::uint32_t& hi) {
  const __half2_raw h0 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFF), __NV_E4M3);
  const __half2_raw h1 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  const float2 f0 = __half22float2(*reinterpret_cast<const __half2*>(&h0));
  const float2 f1 = __half22float2(*reinterpret_cast<const __half2*>(&h1));
  lo = pack_bf16x2(f0.x * scale, f0.y * scale);
  hi = pack_bf16x2(f1.x * scale, f1.y * scale);
}

// Byte address of a token's data / scales in a paged cache.
struct CacheView {
  const std::uint8_t* base;
  int block_tokens;
  int num_blocks;
  unsigned long long stride;
  __device__ __forceinline__ bool valid(long long slot) const {
    return slot >= 0 && slot < static_cast<long long>(num_blocks) * block_tokens;
  }
  __device__ __forceinline__ const std::uint8_t* data(long long slot) const {
    const long long blk = slot / block_tokens, off = slot % block_tokens;
    return base + blk * stride + off * kTokenDataBytes;
  }
  __device__ __forceinline__ const std::uint8_t* scales(long long slot) const {
    const long long blk = slot / block_tokens, off = slot % block_tokens;
    return base + blk * stride + static_cast<long long>(block_tokens) * kTokenDataBytes +
           off * kTokenScaleBytes;
  }
};
inline CacheView view_of(const PagedCache& c) {
  return {c.base, c.block_tokens, c.num_blocks, static_cast<unsigned long long>(c.stride)};
}

// ---- quantization (twin of ref::ue8m0_exponent / ref::quantize_insert, bit-identical)
// Exact ceil(log2(max(amax,1e-4)/448)) on the fp32 quotient; NaN amax -> floor; inf -> 128.
__device__ __forceinline__ int ue8m0_exponent(float amax) {
  const float a = (amax >= kAmaxFloor) ? amax : kAmaxFloor;
  const float r = __fdiv_rn(a, kFp8Max);
  if (isinf(r)) return 128;
  const unsigned bits = __float_as_uint(r);  // r >= 2.2e-7: a normal float
  const int E = static_cast<int>((bits >> 23) & 0xFFu);
  return (bits & 0x7FFFFFu) == 0 ? E - 127 : E - 126;
}
// 2^k exactly, k in [-149, 127].
__device__ __forceinline__ float exp2_int(int k) {
  return k >= -126 ? __uint_as_float(static_cast<unsigned>(k + 127) << 23)
                   : __uint_as_float(1u << (k + 149));
}
__device__ __forceinline__ float clamp_fp8_range(float v) {  // NaN passes through, like the ref
  if (v > kFp8Max) v = kFp8Max;
  if (v < -kFp8Max) v = -kFp8Max;
  return v;
}
__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ float to_f32(std::uint16_t x) { return __uint_as_float(static_cast<unsigned>(x) << 16); }

// One warp quantizes one 512-wide row (any element type readable by to_f32) into data (576 B) and
// scales (8 B) of a token. Lane l handles elements 2l, 2l+1 of each 64-wide tile and rope pair l.
template <class T>
__device__ __forceinline__ void quantize_row_warp(const T* row, std::uint8_t* data, std::uint8_t* scales,
                                                  int lane) {
  unsigned my_byte = 0;
#pragma unroll
  for (int k = 0; k < kNumTiles; ++k) {
    const float x0 = to_f32(row[k * kTileWidth + 2 * lane]);
    const float x1 = to_f32(row[k * kTileWidth + 2 * lane + 1]);
    float amax = fmaxf(fabsf(x0), fabsf(x1));  // fmaxf drops NaN, like the ref's '>' test
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    int byte = ue8m0_exponent(amax) + kScaleBias;
    byte = byte < 0 ? 0 : (byte > 255 ? 255 : byte);
    if (lane == k) my_byte = static_cast<unsigned>(byte);
    const float inv = exp2_int(kScaleBias - byte);
    const float2 v = make_float2(clamp_fp8_range(x0 * inv), clamp_fp8_range(x1 * inv));
    const __nv_fp8x2_storage_t q = __nv_cvt_float2_to_fp8x2(v, __NV_SATFINITE, __NV_E4M3);
    *reinterpret_cast<std::uint16_t*>(data + k * kTileWidth + 2 * lane) = static_cast<std::uint16_t>(q);
  }
  if (lane < kTokenScaleBytes) scales[lane] = static_cast<std::uint8_t>(my_byte);  // lane 7: pad 0
  const float r0 = to_f32(row[kNopeDim + 2 * lane]);
  const float r1 = to_f32(row[kNopeDim + 2 * lane + 1]);
  *reinterpret_cast<std::uint32_t*>(data + kNopeDim + 4 * lane) = pack_bf16x2(r0, r1);
}

}  // namespace graphsafe::ds4::cuda::detail
