// fp8 e4m3 x ue8m0 scale -> bf16, the dequantization every DS4 kernel runs on its rows: the fast
// integer/bf16 path (dequant16, used by the attention producer and the gather) against the fp32
// path it replaced (dequant4_via_f32) and against host arithmetic, for every byte and every scale.
// Bit-for-bit equality is what keeps the paged-direct and gather paths bitwise equal.
#include <catch2/catch.hpp>

#include "cuda_support.cuh"

#include <cuda_runtime_api.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

namespace gd = graphsafe::ds4::cuda::detail;

namespace {

// The fp32 path the kernels used before dequant16 (fp8 -> f16 -> f32, times the scale, -> bf16):
// a second, independent device reference beside the host arithmetic below.
__device__ float ue8m0_to_float(unsigned byte) { return __uint_as_float(byte << 23); }  // 0 -> 0, 255 -> inf
__device__ void dequant4_via_f32(std::uint32_t w, float scale, std::uint32_t& lo, std::uint32_t& hi) {
  const __half2_raw h0 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w & 0xFFFF), __NV_E4M3);
  const __half2_raw h1 = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(w >> 16), __NV_E4M3);
  const float2 f0 = __half22float2(*reinterpret_cast<const __half2*>(&h0));
  const float2 f1 = __half22float2(*reinterpret_cast<const __half2*>(&h1));
  lo = gd::pack_bf16x2(f0.x * scale, f0.y * scale);
  hi = gd::pack_bf16x2(f1.x * scale, f1.y * scale);
}

// Block = scale byte, thread = 16-byte chunk k (bytes 16k .. 16k+15): both paths, all 256 bytes.
__global__ void dequant_all(std::uint16_t* fast, std::uint16_t* ref) {
  const unsigned sb = blockIdx.x, k = threadIdx.x;  // 16 threads x 16 bytes = all 256 byte values
  std::uint32_t v[4];
  for (int i = 0; i < 4; ++i) {
    const unsigned b0 = 16 * k + 4 * i;
    v[i] = b0 | (b0 + 1) << 8 | (b0 + 2) << 16 | (b0 + 3) << 24;
  }
  const uint4 w = make_uint4(v[0], v[1], v[2], v[3]);
  uint4 lo, hi;
  gd::dequant16(w, sb, lo, hi);
  std::uint16_t* f = fast + (sb * 256 + 16 * k);
  reinterpret_cast<uint4*>(f)[0] = lo;
  reinterpret_cast<uint4*>(f)[1] = hi;
  const float sc = ue8m0_to_float(sb);
  std::uint32_t r[8];
  for (int i = 0; i < 4; ++i) dequant4_via_f32(v[i], sc, r[2 * i], r[2 * i + 1]);
  std::memcpy(ref + (sb * 256 + 16 * k), r, sizeof r);
}

// Host: the e4m3 value of byte b times 2^(sb - 127), rounded to bf16 (nearest even); false for NaN
// bytes and results outside bf16's finite range.
bool host_bf16(unsigned b, unsigned sb, std::uint16_t& out) {
  const unsigned e = (b >> 3) & 15, m = b & 7;
  if (e == 15 && m == 7) return false;  // e4m3 NaN
  double v = e ? std::ldexp(1.0 + m / 8.0, int(e) - 7) : std::ldexp(m / 8.0, -6);
  v = std::ldexp(v, int(sb) - 127);
  if (b & 0x80) v = -v;
  const float f = static_cast<float>(v);  // exact: <= 4 significant bits, above 2^-149 for sb >= 0
  if (!std::isfinite(f) || std::fabs(v) > 3.38e38) return false;
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);  // round to nearest even
  out = static_cast<std::uint16_t>(u >> 16);
  return true;
}

}  // namespace

TEST_CASE("dequant16 equals the fp32 path and host arithmetic for every e4m3 byte and ue8m0 scale",
          "[ds4][dequant]") {
  constexpr int kScales = 256;  // every ue8m0 byte: 2^-127 .. 2^128
  std::uint16_t *fast = nullptr, *ref = nullptr;
  const std::size_t n = std::size_t(kScales) * 256;
  REQUIRE(cudaMalloc(&fast, n * 2) == cudaSuccess);
  REQUIRE(cudaMalloc(&ref, n * 2) == cudaSuccess);
  dequant_all<<<kScales, 16>>>(fast, ref);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  std::vector<std::uint16_t> hf(n), hr(n);
  REQUIRE(cudaMemcpy(hf.data(), fast, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  REQUIRE(cudaMemcpy(hr.data(), ref, n * 2, cudaMemcpyDeviceToHost) == cudaSuccess);
  cudaFree(fast);
  cudaFree(ref);
  std::size_t compared = 0, subnormal = 0, mismatch_ref = 0, mismatch_host = 0;
  for (unsigned sb = 0; sb < kScales; ++sb)
    for (unsigned b = 0; b < 256; ++b) {
      std::uint16_t want;
      if (!host_bf16(b, sb, want)) continue;
      const std::uint16_t got = hf[sb * 256 + b], r = hr[sb * 256 + b];
      ++compared;
      if ((want & 0x7F80) == 0 && (want & 0x7F)) ++subnormal;
      // The fp32 path reads scale bytes 0 and 255 as 0 and inf (ue8m0_to_float); host and
      // dequant16 as 2^-127 and 2^128, like the CPU reference's dequantize_row.
      if (sb != 0 && sb != 255 && got != r && ++mismatch_ref <= 5)
        UNSCOPED_INFO("byte 0x" << std::hex << b << " scale byte " << std::dec << sb << ": dequant16 0x" << std::hex
                                << got << " vs fp32 path 0x" << r);
      if (got != want && ++mismatch_host <= 5)
        UNSCOPED_INFO("byte 0x" << std::hex << b << " scale byte " << std::dec << sb << ": dequant16 0x" << std::hex
                                << got << " vs host 0x" << want);
    }
  INFO(compared << " (byte, scale) pairs compared, " << subnormal << " with subnormal bf16 results");
  CHECK(compared > 60000);
  CHECK(subnormal > 0);  // e4m3 subnormals and bf16 subnormal results are in the sweep
  CHECK(mismatch_ref == 0);
  CHECK(mismatch_host == 0);
}
