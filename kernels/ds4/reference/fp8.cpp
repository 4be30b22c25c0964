// Scalar conversions: fp8 e4m3fn and bf16, both round-to-nearest-even, bit-exact with CUDA.
#include <graphsafe/ds4/reference.hpp>

#include <array>
#include <bit>
#include <cmath>
#include <limits>

namespace graphsafe::ds4::ref {

std::uint8_t fp8_e4m3_from_float(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t mag = bits & 0x7FFFFFFFu;
  if (mag > 0x7F800000u) return 0x7F;               // NaN (any sign) -> canonical positive NaN
  if (mag > 0x43E80000u) return sign | 0x7E;        // |x| > 464 = 448 + half ulp (incl. inf)
  if (mag <= 0x3A800000u) return sign;              // |x| <= 2^-10: ties to even -> zero
  // Here 2^-10 < |x| <= 464, so x is a normal float with unbiased exponent E in [-10, 8].
  const int e = static_cast<int>(mag >> 23) - 127;
  const int e_eff = e < -6 ? -6 : e;                // e4m3 min normal exponent; below: subnormals
  const std::uint32_t sig = (mag & 0x7FFFFFu) | 0x800000u;  // 24-bit significand, |x| = sig*2^(e-23)
  // Quantum of the target binade is 2^(e_eff-3): q = |x| / 2^(e_eff-3) = sig >> shift.
  const int shift = 20 + (e_eff - e);               // 20..24
  std::uint32_t q = sig >> shift;
  const std::uint32_t rem = sig & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;  // RNE; q == 16 carries into the exponent
  // code = biased_exp * 8 + mantissa, and biased_exp * 8 + mantissa == (e_eff + 6) * 8 + q both for
  // normals (q in [8, 16]) and subnormals (e_eff = -6, q in [0, 8]).
  return static_cast<std::uint8_t>(sign | static_cast<std::uint32_t>((e_eff + 6) * 8 + static_cast<int>(q)));
}

namespace {
std::array<float, 256> make_fp8_table() {
  std::array<float, 256> t{};
  for (int v = 0; v < 256; ++v) {
    const int e = (v >> 3) & 0xF;
    const int m = v & 7;
    float mag;
    if (e == 15 && m == 7) {  // NaN of either sign decodes to a positive quiet NaN, as CUDA
      t[static_cast<std::size_t>(v)] = std::numeric_limits<float>::quiet_NaN();
      continue;
    }
    if (e == 0) {
      mag = std::ldexp(static_cast<float>(m), -9);
    } else {
      mag = std::ldexp(static_cast<float>(8 + m), e - 10);
    }
    t[static_cast<std::size_t>(v)] = (v & 0x80) ? -mag : mag;
  }
  return t;
}
}  // namespace

float fp8_e4m3_to_float(std::uint8_t v) {
  static const std::array<float, 256> table = make_fp8_table();
  return table[v];
}

std::uint16_t bf16_from_float(float x) {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FFF;  // NaN, as __float2bfloat16_rn
  const std::uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);  // RNE; overflow -> inf
  return static_cast<std::uint16_t>(rounded >> 16);
}

float bf16_to_float(std::uint16_t v) {
  return std::bit_cast<float>(static_cast<std::uint32_t>(v) << 16);
}

}  // namespace graphsafe::ds4::ref
