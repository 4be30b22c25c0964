// Internal helpers shared by the DS4 kernels: error checks, cp.async / ldmatrix / mma wrappers,
// fp8_ds_mla addressing. Not installed.
#pragma once

#include <graphsafe/ds4/detail/cache_view.hpp>
#include <graphsafe/ds4/layout.hpp>
#include <graphsafe/error.hpp>

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
    throw graphsafe::cuda_error(std::string("graphsafe::ds4: launch of ") + kernel + " failed: " +
                                    cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")",
                                static_cast<int>(err));
}
inline void check_cuda(cudaError_t err, const char* what) {
  if (err != cudaSuccess)
    throw graphsafe::cuda_error(std::string("graphsafe::ds4: ") + what + " failed: " + cudaGetErrorName(err) +
                                    " (" + cudaGetErrorString(err) + ")",
                                static_cast<int>(err));
}
[[noreturn]] inline void bad_arg(const std::string& fn, const std::string& what, long long value,
                                 const std::string& allowed) {
  throw graphsafe::invalid_argument_error("graphsafe::ds4::cuda::" + fn + ": " + what + " = " +
                              std::to_string(value) + " is not allowed; allowed: " + allowed);
}
inline void require_ptr(const std::string& fn, const char* name, const void* p) {
  if (p == nullptr)
    throw graphsafe::invalid_argument_error("graphsafe::ds4::cuda::" + fn + ": " + name +
                                " is null; a device pointer is required");
}
inline void require_heads(const std::string& fn, int h) {
  if (h != 64 && h != 128) bad_arg(fn, "heads (H)", h, "64 or 128 (FlashMLA's padded head counts)");
}
inline void require_batch(const std::string& fn, int b) {
  if (b <= 0) bad_arg(fn, "batch (B)", b, "B >= 1");
}
inline void require_query_tokens(const std::string& fn, int s_q) {
  if (s_q < 1 || s_q > kMaxQueryTokens)
    bad_arg(fn, "query_tokens (s_q)", s_q, "1 .. " + std::to_string(kMaxQueryTokens) + " query tokens per request");
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
  if (static_cast<long long>(c.num_blocks) * c.block_tokens > 0x7FFFFFFFLL || c.num_blocks < 0)
    bad_arg(fn, std::string(name) + ".num_blocks * block_tokens",
            static_cast<long long>(c.num_blocks) * c.block_tokens, "0 .. 2^31-1 (int32 slots)");
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

// Two e4m3 bytes of w (bytes 0, 1 with kSel = 0x9180; bytes 2, 3 with 0xB3A2) -> the bf16x2 bit
// patterns of their values times 2^-120: sign to bit 15, exponent+mantissa (7 bits) to bits 4-10.
// bf16 and e4m3 subnormals line up (e4m3 exponent 0 -> bf16 exponent 0), so every finite byte maps
// exactly. prmt puts each byte in the low half of its 16-bit lane and its sign, replicated (selector
// bit 3), in the high half; << 4 moves em to bits 4-10 and a sign copy to bit 15; the mask keeps
// those (3 instructions: prmt, shift, and).
template <unsigned kSel>
__device__ __forceinline__ std::uint32_t e4m3x2_to_bf16x2_bits(std::uint32_t w) {
  std::uint32_t q;
  asm("prmt.b32 %0, %1, 0, %2;" : "=r"(q) : "r"(w), "n"(kSel));
  return (q << 4) & 0x87F087F0u;
}

__device__ __forceinline__ std::uint32_t bf16x2_bits_mul(std::uint32_t a, __nv_bfloat162 m) {
  const __nv_bfloat162 v = __hmul2(*reinterpret_cast<const __nv_bfloat162*>(&a), m);
  return *reinterpret_cast<const std::uint32_t*>(&v);
}

// 16 fp8 e4m3 values (one 16-byte chunk of a tile) * 2^(scale_byte - 127) -> 16 bf16 (lo: values
// 0-7, hi: 8-15), bit-identical to the fp32 path it replaced (fp8 -> f16 -> f32 x scale -> bf16; kept
// in tests/ds4/test_ds4_dequant.cu as a reference) for every finite byte (the quantizer saturates:
// no NaN bytes). Why not the fp32 path: its fp8 -> f16 -> f32 -> bf16 chain is four instructions
// of the conversion pipe per 4 values, 16 lanes/clock/SM on sm_90 -- the warp-specialized attention
// kernel's producer was bound by it. Here: a byte permute, a shift and a mask place the bits,
// and one or two bf16x2 multiplies (FMA pipe; bf16 arithmetic keeps subnormals) apply 2^120 * scale.
// 2^120 * scale = 2^(scale_byte - 7) as a bf16x2 factor, valid while that is finite (scale_byte
// <= 134: every real KV scale); ue8m0_is_small() says whether it is.
__device__ __forceinline__ bool ue8m0_is_small(unsigned scale_byte) { return scale_byte <= 134u; }
__device__ __forceinline__ __nv_bfloat162 ue8m0_factor(unsigned scale_byte) {
  const std::uint32_t f = ((scale_byte + 120u) << 7) * 0x10001u;
  return *reinterpret_cast<const __nv_bfloat162*>(&f);
}

// dequant16 for a small scale byte, with its factor precomputed (ue8m0_factor): 32 instructions.
__device__ __forceinline__ void dequant16_small(const uint4& w, __nv_bfloat162 f, uint4& lo, uint4& hi) {
  lo = make_uint4(bf16x2_bits_mul(e4m3x2_to_bf16x2_bits<0x9180>(w.x), f),
                  bf16x2_bits_mul(e4m3x2_to_bf16x2_bits<0xB3A2>(w.x), f),
                  bf16x2_bits_mul(e4m3x2_to_bf16x2_bits<0x9180>(w.y), f),
                  bf16x2_bits_mul(e4m3x2_to_bf16x2_bits<0xB3A2>(w.y), f));
  hi = make_uint4(bf16x2_bits_mul(e4m3x2_to_bf16x2_bits<0x9180>(w.z), f),
                  bf16x2_bits_mul(e4m3x2_to_bf16x2_bits<0xB3A2>(w.z), f),
                  bf16x2_bits_mul(e4m3x2_to_bf16x2_bits<0x9180>(w.w), f),
                  bf16x2_bits_mul(e4m3x2_to_bf16x2_bits<0xB3A2>(w.w), f));
}

// Any scale byte. Above 134, 2^(scale_byte - 134) then 2^127 (exact: the first product is
// >= 2^-129 with <= 4 significant bits). Bytes 0 (2^-127) and 255 (2^128) are exact too, like the
// CPU reference (the fp32 path reads them as 0 and inf).
__device__ __forceinline__ void dequant16(const uint4& w, unsigned scale_byte, uint4& lo, uint4& hi) {
  if (ue8m0_is_small(scale_byte)) {
    dequant16_small(w, ue8m0_factor(scale_byte), lo, hi);
    return;
  }
  const std::uint32_t f1 = ((scale_byte - 7u) << 7) * 0x10001u, f2 = (254u << 7) * 0x10001u;
  dequant16_small(w, *reinterpret_cast<const __nv_bfloat162*>(&f1), lo, hi);
  const __nv_bfloat162 m2 = *reinterpret_cast<const __nv_bfloat162*>(&f2);
  lo = make_uint4(bf16x2_bits_mul(lo.x, m2), bf16x2_bits_mul(lo.y, m2), bf16x2_bits_mul(lo.z, m2), bf16x2_bits_mul(lo.w, m2));
  hi = make_uint4(bf16x2_bits_mul(hi.x, m2), bf16x2_bits_mul(hi.y, m2), bf16x2_bits_mul(hi.z, m2), bf16x2_bits_mul(hi.w, m2));
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

// ---- Hopper wgmma (sm_90a) -----------------------------------------------------------------
// Shared-memory matrix descriptor, no swizzle ("interleave" canonical layout of 8x16-byte core
// matrices): lbo / sbo in bytes (PTX ISA "matrix descriptor"; CUTLASS GmmaDescriptor).
__device__ __forceinline__ std::uint64_t wgmma_desc(const void* smem, std::uint32_t lbo, std::uint32_t sbo) {
  std::uint64_t d = (smem_u32(smem) & 0x3FFFFu) >> 4;
  d |= static_cast<std::uint64_t>((lbo >> 4) & 0x3FFFu) << 16;
  d |= static_cast<std::uint64_t>((sbo >> 4) & 0x3FFFu) << 32;
  return d;
}
// Opaque copy: keeps the compiler from hoisting 32 unrolled descriptor values out of the tile loop
// as loop invariants (which costs ~128 registers and spills).
__device__ __forceinline__ std::uint64_t launder(std::uint64_t x) {
  asm volatile("mov.b64 %0, %0;\n" : "+l"(x));
  return x;
}
// wgmma exists only in the sm_90a feature set. The CMake targets are "90a-real;90-virtual": the
// compute_90 PTX (JIT for other GPUs) gets traps here, and the host never launches the wgmma kernel
// on a device whose compute capability is not 9.x (sparse_attention.cu: use_wgmma()).
#if defined(__CUDA_ARCH__) && !defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define GRAPHSAFE_DS4_NO_WGMMA 1
#endif
__device__ __forceinline__ void wgmma_fence() {
#ifndef GRAPHSAFE_DS4_NO_WGMMA
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#else
  __trap();
#endif
}
__device__ __forceinline__ void wgmma_commit() {
#ifndef GRAPHSAFE_DS4_NO_WGMMA
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void wgmma_wait() {
#ifndef GRAPHSAFE_DS4_NO_WGMMA
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
#endif
}
// 2^x in one MUFU instruction (exp2f adds a denormal-range fixup around it): inputs are <= 0 in the
// softmax, so the only difference is results below 2^-126 flushing to +0 -- far below a bf16 P's
// resolution next to the row maximum's 1. ex2(-inf) = +0.
__device__ __forceinline__ float exp2_ftz(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}
// v = pred ? *ptr : fallback, as one predicated load: nothing reads v until its first real use, so
// a load issued tiles ahead is never waited for early (a select or a sign extension after a plain
// load would wait for it right there).
__device__ __forceinline__ int ld_nc_or(const std::int32_t* ptr, bool pred, int fallback) {
  int v = fallback;
  asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %2, 0;\n@p ld.global.nc.b32 %0, [%1];\n}\n"
               : "+r"(v) : "l"(ptr), "r"(pred ? 1 : 0));
  return v;
}
// ---- DSMEM push with an mbarrier transaction count (sm_90): the receiver's barrier completes
// when all expected bytes have landed, so the sender needs no cluster barrier after its stores.
__device__ __forceinline__ void mbar_init(std::uint64_t* bar, unsigned count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(count) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_expect_tx(std::uint64_t* bar, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_u32(bar)), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_wait_cluster(std::uint64_t* bar, unsigned parity) {
  asm volatile(
      "{\n.reg .pred p;\nWAIT_%=:\n"
      "mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra WAIT_%=;\n}\n" ::"r"(smem_u32(bar)), "r"(parity) : "memory");
}
// Programmatic dependent launch: wait until the previous kernel of the stream has
// finished and its writes are visible, then let the next kernel launch, so its CTAs take the
// multiprocessors this grid frees and run up to their own wait (the launch gap between back-to-back
// kernels is hidden). Both are no-ops without the launch attribute.
__device__ __forceinline__ void grid_dependency_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}

__device__ __forceinline__ bool mbar_try_wait(std::uint64_t* bar, unsigned parity) {
  std::uint32_t ok;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(ok) : "r"(smem_u32(bar)), "r"(parity) : "memory");
  return ok != 0;
}
__device__ __forceinline__ void mbar_wait(std::uint64_t* bar, unsigned parity) {
  while (!mbar_try_wait(bar, parity)) {
  }
}
__device__ __forceinline__ void mbar_arrive(std::uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_u32(bar)) : "memory");
}
// Bulk copy (TMA without a tensor map): `bytes` (a multiple of 16) from global to shared memory, counted on `bar`'s transaction count.
__device__ __forceinline__ void bulk_copy_g2s(void* smem, const void* gmem, unsigned bytes, std::uint64_t* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_u32(smem)),
               "l"(gmem), "r"(bytes), "r"(smem_u32(bar))
               : "memory");
}
// The shared::cluster address of `local` (a shared-memory address of this CTA) in CTA `rank`.
__device__ __forceinline__ std::uint32_t mapa_u32(const void* local, unsigned rank) {
  std::uint32_t r;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(r) : "r"(smem_u32(local)), "r"(rank));
  return r;
}
__device__ __forceinline__ void st_async_v4(std::uint32_t addr, float4 v, std::uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];\n" ::"r"(addr),
               "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(bar) : "memory");
}
__device__ __forceinline__ void st_async_v2(std::uint32_t addr, float a, float b, std::uint32_t bar) {
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];\n" ::"r"(addr), "f"(a),
               "f"(b), "r"(bar) : "memory");
}
// Ordinary shared-memory stores (st.shared, cp.async) -> visible to the async proxy (wgmma).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// D[64x64] (+)= A[64x16] * B[16x64], A and B K-major in shared memory (bf16 in, fp32 accumulate).
__device__ __forceinline__ void wgmma_m64n64k16(float (&d)[32], std::uint64_t da, std::uint64_t db, int accumulate) {
#ifndef GRAPHSAFE_DS4_NO_WGMMA
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, %32, %33, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(da), "l"(db), "r"(accumulate));
#else
  (void)d; (void)da; (void)db; (void)accumulate;
#endif
}
// D[64x128] += A[64x16] * B[16x128], A in registers (the m64n16 accumulator layout of the thread,
// bf16 pairs: rows r / r + 8, columns 2 (lane % 4) and + 8), B MN-major (transposed) in shared
// memory. Two of these replace one m64n256k16 where the kernel's launch bound allows fewer
// than ~160 registers per thread: ptxas checks each instruction's operands against the kernel-wide
// count, whatever setmaxnreg grants the region (C7602 with 128).
__device__ __forceinline__ void wgmma_m64n128k16_rs_tb(float (&d)[64], std::uint32_t a0, std::uint32_t a1,
                                                       std::uint32_t a2, std::uint32_t a3, std::uint64_t db) {
#ifndef GRAPHSAFE_DS4_NO_WGMMA
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, {%64,%65,%66,%67}, %68, 1, 1, 1, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(db));
#else
  (void)d; (void)a0; (void)a1; (void)a2; (void)a3; (void)db;
#endif
}
// D[64x128] += A[64x16] * B[16x128], A K-major, B MN-major (transposed), both in shared memory.
__device__ __forceinline__ void wgmma_m64n128k16_tb(float (&d)[64], std::uint64_t da, std::uint64_t db) {
#ifndef GRAPHSAFE_DS4_NO_WGMMA
  asm volatile(
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, %64, %65, 1, 1, 1, 0, 1;\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(da), "l"(db));
#else
  (void)d; (void)da; (void)db;
#endif
}

}  // namespace graphsafe::ds4::cuda::detail
