// CPU tests of the DS4 reference (kernels/ds4/reference): scalar conversions, the fp8_ds_mla byte
// layout, the compressor, both combine flavours, the gather and the attention with sink. Every check
// is against hand-computed bytes/values or an independent double-precision recomputation.
// Tiny shapes (docs/ds4_model.md §7.3): B = 2, H = 4, W = 4, K = 8, max_model_len = 512, SWA blocks of 16.
#include <catch2/catch.hpp>

#include <graphsafe/ds4/detail/cache_view.hpp>
#include <graphsafe/ds4/layout.hpp>
#include <graphsafe/ds4/problem.hpp>
#include <graphsafe/ds4/reference.hpp>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace ds4 = graphsafe::ds4;
namespace ref = graphsafe::ds4::ref;
using Catch::Matchers::Contains;

namespace {

ds4::LayerConfig tiny(int ratio) {
  return ds4::LayerConfig{.ratio = ratio, .window = 4, .topk = 8, .heads = 4, .max_model_len = 512,
                          .swa_block_tokens = 16};
}

std::uint32_t bits_of(float f) { std::uint32_t u; std::memcpy(&u, &f, 4); return u; }

// Test-side random numbers (only bounds/equalities are checked, so the distribution's exact values
// do not matter).
struct TestRng {
  std::mt19937_64 g;
  explicit TestRng(std::uint64_t s) : g(s) {}
  double uniform(double lo, double hi) { return lo + (hi - lo) * static_cast<double>(g() >> 11) * 0x1.0p-53; }
  float normal() {  // Box-Muller
    const double u1 = 1.0 - uniform(0, 1), u2 = uniform(0, 1);
    return static_cast<float>(std::sqrt(-2 * std::log(u1)) * std::cos(6.283185307179586 * u2));
  }
};

// Independent slot math straight from the block tables (docs/ds4_model.md §3.2).
std::int64_t swa_slot_indep(const ds4::DecodeProblem& p, int b, int pos) {
  const int bs = p.cfg.swa_block_tokens;
  return static_cast<std::int64_t>(p.swa_block_table[b * p.swa_blocks_per_req + pos / bs]) * bs + pos % bs;
}
std::int64_t cmp_slot_indep(const ds4::DecodeProblem& p, int b, int j) {
  const int e = 256 / p.cfg.ratio;
  return static_cast<std::int64_t>(p.cmp_block_table[b * p.cmp_blocks_per_req + j / e]) * e + j % e;
}
// Independent attended lists: local compressed ids, then SWA positions.
std::vector<int> expected_picks(const ds4::DecodeProblem& p, int b) {
  const int L = p.seq_lens[b], r = p.cfg.ratio;
  std::vector<int> out;
  if (r == 4) {
    for (int i = 0; i < std::min(L / 4, p.cfg.topk); ++i) out.push_back(p.topk_local[b * p.cfg.topk + i]);
  } else if (r == 128) {
    for (int j = 0; j < L / 128; ++j) out.push_back(j);
  }
  return out;
}
std::vector<int> expected_swa_positions(const ds4::DecodeProblem& p, int b) {
  const int L = p.seq_lens[b];
  std::vector<int> out;
  for (int pos = std::max(0, L - p.cfg.window); pos < L; ++pos) out.push_back(pos);
  return out;
}
std::vector<float> dequant(const ds4::PagedCache& c, std::int64_t slot) {
  std::vector<float> r(512);
  ref::dequantize_row(c, slot, r.data());
  return r;
}

// Naive double-precision attention with sink over explicit rows; also returns lse per head.
std::vector<double> naive_attention(const ds4::DecodeProblem& p, int b, const std::vector<std::vector<float>>& rows,
                                    std::vector<double>* lse_out = nullptr) {
  const int H = p.cfg.heads;
  std::vector<double> out(static_cast<std::size_t>(H) * 512, 0.0);
  if (lse_out) lse_out->assign(H, -INFINITY);
  if (rows.empty()) return out;
  for (int h = 0; h < H; ++h) {
    std::vector<double> s;
    for (const auto& k : rows) {
      double dot = 0;
      for (int d = 0; d < 512; ++d) dot += static_cast<double>(ref::bf16_to_float(p.q[(b * H + h) * 512 + d])) * k[d];
      s.push_back(dot / std::sqrt(512.0));
    }
    const double m = *std::max_element(s.begin(), s.end());
    double z = 0;
    for (double v : s) z += std::exp(v - m);
    const double lse = m + std::log(z);
    if (lse_out) (*lse_out)[h] = lse;
    for (std::size_t i = 0; i < rows.size(); ++i) {
      for (int d = 0; d < 512; ++d) out[h * 512 + d] += std::exp(s[i] - lse) * rows[i][d];
    }
    const double f = 1.0 / (1.0 + std::exp(static_cast<double>(p.sink[h]) - lse));
    for (int d = 0; d < 512; ++d) out[h * 512 + d] *= f;
  }
  return out;
}

std::vector<std::vector<float>> attended_rows(ds4::DecodeProblem& p, int b) {
  std::vector<std::vector<float>> rows;
  for (int j : expected_picks(p, b)) rows.push_back(dequant(p.cmp_view(), cmp_slot_indep(p, b, j)));
  for (int pos : expected_swa_positions(p, b)) rows.push_back(dequant(p.swa_view(), swa_slot_indep(p, b, pos)));
  return rows;
}

struct Case { int ratio; std::vector<std::int32_t> lens; };
// docs/ds4_model.md §7.3 edges: L < W, n_c = 0, n_c < K, n_c = K, n_c > K, exact multiples of r, seq_len 0, full.
std::vector<Case> edge_cases() {
  return {
      {1, {1, 3}},      {1, {4, 5}},       {1, {0, 512}},     {4, {3, 5}},       {4, {4, 8}},
      {4, {15, 17}},    {4, {32, 33}},     {4, {255, 257}},   {4, {0, 512}},     {4, {511, 512}},
      {128, {3, 5}},    {128, {127, 128}}, {128, {255, 257}}, {128, {0, 512}},   {128, {384, 511}},
  };
}

}  // namespace

// ============================================ fp8 / bf16 ========================================

TEST_CASE("fp8 e4m3: hand-computed codes decode exactly", "[ds4][fp8]") {
  struct Row { std::uint8_t code; float value; };
  const Row rows[] = {
      {0x00, 0.0f},     {0x01, 0x1p-9f},  {0x02, 0x1p-8f},  {0x07, 7 * 0x1p-9f}, {0x08, 0x1p-6f},
      {0x0F, 15 * 0x1p-9f}, {0x38, 1.0f}, {0x3C, 1.5f},     {0x40, 2.0f},        {0x77, 240.0f},
      {0x78, 256.0f},   {0x7E, 448.0f},   {0xB8, -1.0f},    {0xFE, -448.0f},     {0x81, -0x1p-9f},
  };
  for (const Row& r : rows) {
    INFO("code 0x" << std::hex << int(r.code));
    CHECK(ref::fp8_e4m3_to_float(r.code) == r.value);
  }
  CHECK(bits_of(ref::fp8_e4m3_to_float(0x80)) == 0x80000000u);  // -0
  CHECK(std::isnan(ref::fp8_e4m3_to_float(0x7F)));
  CHECK(std::isnan(ref::fp8_e4m3_to_float(0xFF)));
}

TEST_CASE("fp8 e4m3: every code round-trips and positive codes are strictly increasing", "[ds4][fp8]") {
  int finite = 0;
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    ++finite;
    INFO("code " << c);
    CHECK(int(ref::fp8_e4m3_from_float(ref::fp8_e4m3_to_float(static_cast<std::uint8_t>(c)))) == c);
    CHECK(ref::fp8_e4m3_to_float(static_cast<std::uint8_t>(c)) ==
          -ref::fp8_e4m3_to_float(static_cast<std::uint8_t>(c ^ 0x80)));
  }
  CHECK(finite == 254);
  for (int c = 0; c < 0x7E; ++c) {
    CHECK(ref::fp8_e4m3_to_float(static_cast<std::uint8_t>(c)) < ref::fp8_e4m3_to_float(static_cast<std::uint8_t>(c + 1)));
  }
}

TEST_CASE("fp8 e4m3: midpoints round to the even code, neighbours to the nearest", "[ds4][fp8]") {
  for (int c = 0; c < 0x7E; ++c) {
    const double lo = ref::fp8_e4m3_to_float(static_cast<std::uint8_t>(c));
    const double hi = ref::fp8_e4m3_to_float(static_cast<std::uint8_t>(c + 1));
    const float mid = static_cast<float>((lo + hi) / 2);  // exact: fp8 midpoints have <= 5 significant bits
    REQUIRE(static_cast<double>(mid) == (lo + hi) / 2);
    const int even = (c % 2 == 0) ? c : c + 1;
    INFO("between codes " << c << " and " << c + 1);
    CHECK(int(ref::fp8_e4m3_from_float(mid)) == even);
    CHECK(int(ref::fp8_e4m3_from_float(-mid)) == (even | 0x80));
    CHECK(int(ref::fp8_e4m3_from_float(std::nextafter(mid, INFINITY))) == c + 1);
    CHECK(int(ref::fp8_e4m3_from_float(std::nextafter(mid, -INFINITY))) == c);
  }
  // Hand examples in the subnormal range (quantum 2^-9): 1.5 q -> 2, 2.5 q -> 2, 7.5 q -> 8 (= min normal).
  CHECK(ref::fp8_e4m3_from_float(1.5f * 0x1p-9f) == 0x02);
  CHECK(ref::fp8_e4m3_from_float(2.5f * 0x1p-9f) == 0x02);
  CHECK(ref::fp8_e4m3_from_float(7.5f * 0x1p-9f) == 0x08);
  CHECK(ref::fp8_e4m3_from_float(0x1p-10f) == 0x00);   // half the smallest subnormal: tie to 0
  CHECK(ref::fp8_e4m3_from_float(std::nextafter(0x1p-10f, 1.0f)) == 0x01);
  // Normal range: 250 lies between 240 (0x77) and 256 (0x78), nearer 256. In [16, 32) the quantum is
  // 2: 16 = 0x58, 18 = 0x59, 20 = 0x5A; 17 is a tie 16|18 -> 0x58 (even), 19 a tie 18|20 -> 0x5A.
  CHECK(ref::fp8_e4m3_from_float(250.0f) == 0x78);
  CHECK(ref::fp8_e4m3_from_float(17.0f) == 0x58);
  CHECK(ref::fp8_e4m3_from_float(19.0f) == 0x5A);
}

TEST_CASE("fp8 e4m3: saturation, signed zero, NaN", "[ds4][fp8]") {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Row { float x; int code; };
  const Row rows[] = {
      {448.0f, 0x7E}, {449.0f, 0x7E}, {464.0f, 0x7E}, {465.0f, 0x7E}, {1e30f, 0x7E}, {FLT_MAX, 0x7E},
      {inf, 0x7E},    {-500.0f, 0xFE}, {-inf, 0xFE},  {0.0f, 0x00},   {-0.0f, 0x80}, {0x1p-11f, 0x00},
      {-0x1p-10f, 0x80}, {FLT_TRUE_MIN, 0x00}, {nan, 0x7F}, {-nan, 0x7F},
  };
  for (const Row& r : rows) {
    INFO("x = " << r.x);
    CHECK(int(ref::fp8_e4m3_from_float(r.x)) == r.code);
  }
}

TEST_CASE("fp8 e4m3: random values encode to the nearest finite code (brute force)", "[ds4][fp8]") {
  std::vector<double> values;
  for (int c = 0; c <= 0x7E; ++c) values.push_back(ref::fp8_e4m3_to_float(static_cast<std::uint8_t>(c)));
  TestRng rng(7);
  for (int it = 0; it < 50000; ++it) {
    const float x = static_cast<float>(std::exp2(rng.uniform(-13, 10)) * (it % 2 ? -1 : 1));
    const double a = std::fabs(static_cast<double>(x));
    int best = 0;
    for (int c = 1; c <= 0x7E; ++c) {
      const double dc = std::fabs(values[c] - a), db = std::fabs(values[best] - a);
      if (dc < db || (dc == db && c % 2 == 0)) best = c;
    }
    const int expect = best | (x < 0 ? 0x80 : 0);
    INFO("x = " << x);
    REQUIRE(int(ref::fp8_e4m3_from_float(x)) == expect);
  }
}

TEST_CASE("bf16: encoding rounds to nearest even, overflows to inf, canonicalises NaN, and decodes exactly", "[ds4][bf16]") {
  struct Row { float x; std::uint16_t code; };
  const Row rows[] = {
      {1.0f, 0x3F80}, {1.0f + 0x1p-8f, 0x3F80}, {1.0f + 3 * 0x1p-8f, 0x3F82}, {1.0f + 0x1p-8f + 0x1p-20f, 0x3F81},
      {-2.0f, 0xC000}, {0.5f, 0x3F00}, {FLT_MAX, 0x7F80}, {std::numeric_limits<float>::infinity(), 0x7F80},
      {std::numeric_limits<float>::quiet_NaN(), 0x7FFF}, {-std::numeric_limits<float>::quiet_NaN(), 0x7FFF},
      {-0.0f, 0x8000},
  };
  for (const Row& r : rows) {
    INFO("x = " << r.x);
    CHECK(ref::bf16_from_float(r.x) == r.code);
  }
  for (std::uint32_t c = 0; c < 65536; ++c) {
    const auto v = static_cast<std::uint16_t>(c);
    const float f = ref::bf16_to_float(v);
    REQUIRE(bits_of(f) == c << 16);
    if (!std::isnan(f)) REQUIRE(ref::bf16_from_float(f) == v);
  }
}

// ======================================== fp8_ds_mla layout ======================================

TEST_CASE("ue8m0 exponent: hand values and the defining inequality", "[ds4][quant]") {
  struct Row { float amax; int e; };
  const Row rows[] = {
      {448.0f, 0}, {std::nextafter(448.0f, 1e9f), 1}, {224.0f, -1}, {896.0f, 1}, {1000.0f, 2}, {1.0f, -8},
      {3.0f, -7},  {1e-3f, -18}, {100.0f, -2}, {0.0f, -22}, {1e-5f, -22}, {1e-4f, -22}, {1e30f, 91}, {3.0e38f, 120},
      // fp32 quotient one ulp above 2^10 / 2^-10: exact ceil gives 11 / -9 (ceilf(log2f(.)) would say 10 / -10).
      {std::nextafter(458752.0f, 1e9f), 11}, {std::nextafter(0.4375f, 1.0f), -9},
  };
  for (const Row& r : rows) {
    INFO("amax = " << r.amax);
    CHECK(ref::ue8m0_exponent(r.amax) == r.e);
  }
  TestRng rng(11);
  for (int it = 0; it < 2000; ++it) {
    const float amax = static_cast<float>(std::exp2(rng.uniform(-15, 40)));
    const int e = ref::ue8m0_exponent(amax);
    const double a = std::max(static_cast<double>(amax), static_cast<double>(1e-4f));
    INFO("amax = " << amax);
    REQUIRE(448.0 * std::exp2(e - 1) < a);
    REQUIRE(a <= 448.0 * std::exp2(e));
  }
}

// The kernels' slot -> address arithmetic (shift for power-of-two blocks, division otherwise)
// against layout.hpp's offsets computed with / and %. The GPU tests use power-of-two blocks only.
TEST_CASE("CacheView (the kernels' addressing) matches layout.hpp for every block size", "[ds4][quant]") {
  using graphsafe::ds4::cuda::detail::CacheView;
  using graphsafe::ds4::cuda::detail::view_of;
  static std::uint8_t arena[1];  // addresses are compared, never dereferenced
  for (const int bt : {1, 2, 3, 5, 12, 16, 48, 63, 64, 100, 128, 256}) {
    const int nb = 37;
    ds4::PagedCache c{arena, bt, nb, ds4::block_stride_bytes(bt)};
    const CacheView v = view_of(c);
    const bool pow2 = (bt & (bt - 1)) == 0;
    INFO("block_tokens = " << bt);
    CHECK(v.slots == nb * bt);
    CHECK((v.shift >= 0) == pow2);
    if (pow2) CHECK((1 << v.shift) == bt);
    for (long long slot = 0; slot < static_cast<long long>(nb) * bt; ++slot) {
      const auto blk = static_cast<std::size_t>(slot / bt);
      const int off = static_cast<int>(slot % bt);
      const std::uint8_t* want_d = arena + blk * c.stride + ds4::token_data_offset(bt, off);
      const std::uint8_t* want_s = arena + blk * c.stride + ds4::token_scale_offset(bt, off);
      const std::uint8_t *d, *sc;
      v.locate(slot, d, sc);
      REQUIRE(v.valid(slot));
      REQUIRE(d == want_d);
      REQUIRE(sc == want_s);
      REQUIRE(v.data(slot) == want_d);
      REQUIRE(v.scales(slot) == want_s);
    }
    for (const long long bad : {-1LL, -2147483648LL, static_cast<long long>(nb) * bt, 1LL << 40}) {
      INFO("slot = " << bad);
      CHECK_FALSE(v.valid(bad));
    }
  }
  // The largest cache require_cache admits (2^31 - 1 slots would not be a block multiple): the
  // slot count and the last slot's block stay exact in 32 bits.
  ds4::PagedCache big{arena, 64, (1 << 25) - 1, ds4::block_stride_bytes(64)};
  const CacheView v = view_of(big);
  CHECK(v.slots == 64 * ((1 << 25) - 1));
  const std::uint8_t *d, *sc;
  v.locate(v.slots - 1, d, sc);
  CHECK(d == arena + static_cast<std::size_t>((1 << 25) - 2) * big.stride + ds4::token_data_offset(64, 63));
  CHECK_FALSE(v.valid(v.slots));
}

TEST_CASE("fp8_ds_mla: exact byte layout of one inserted token", "[ds4][quant]") {
  CHECK(ds4::block_stride_bytes(64) == 37440);
  CHECK(ds4::block_stride_bytes(16) == 9792);  // 16*584 = 9344 -> 17*576
  CHECK(ds4::block_stride_bytes(4) == 2880);   // 4*584 = 2336 -> 5*576
  CHECK(ds4::block_stride_bytes(2) == 1728);   // C128 compressed block: 2*584 = 1168 -> 3*576

  std::vector<std::uint8_t> buf(3 * 2880, 0xAB);
  const ds4::PagedCache cache{buf.data(), 4, 3, 2880};
  std::vector<float> x(512, 0.0f);
  // tile 0: zeros -> amax floor 1e-4 -> e = -22, byte 105, codes 0.
  // tile 1: 1.0 then 0.5 -> e = -8 (byte 119): 256 -> 0x78, 128 -> 0x70.
  x[64] = 1.0f; for (int i = 65; i < 128; ++i) x[i] = 0.5f;
  // tile 2: 448 then -448 -> e = 0 (byte 127): 0x7E / 0xFE.
  x[128] = 448.0f; for (int i = 129; i < 192; ++i) x[i] = -448.0f;
  // tile 3: -1000 then 1 -> e = 2 (byte 129): -250 rounds to -256 -> 0xF8; 0.25 -> 0x28.
  x[192] = -1000.0f; for (int i = 193; i < 256; ++i) x[i] = 1.0f;
  // tile 4: all 3 -> e = -7 (byte 120): 384 -> 0x7C.
  for (int i = 256; i < 320; ++i) x[i] = 3.0f;
  // tile 5: +-1e-3 -> e = -18 (byte 109): 262.144 -> 256 -> 0x78 / 0xF8.
  for (int i = 320; i < 384; ++i) x[i] = (i % 2) ? -1e-3f : 1e-3f;
  // tile 6: 0.75, last 100 -> e = -2 (byte 125): 3 -> 0x44; 400 is a tie 384|416 -> 384 -> 0x7C.
  for (int i = 384; i < 448; ++i) x[i] = 0.75f;
  x[447] = 100.0f;
  // rope: 1 -> 0x3F80, -2 -> 0xC000, 1+2^-8 -> 0x3F80 (tie to even), rest 0.5 -> 0x3F00.
  for (int i = 448; i < 512; ++i) x[i] = 0.5f;
  x[448] = 1.0f; x[449] = -2.0f; x[450] = 1.0f + 0x1p-8f;

  ref::quantize_insert(x.data(), cache, 6);  // block 1, token 2

  std::vector<std::uint8_t> expect(buf.size(), 0xAB);
  const std::size_t data = 2880 + 2 * 576;       // 4032
  const std::size_t scales = 2880 + 4 * 576 + 2 * 8;  // 5200
  REQUIRE(data == 4032);
  REQUIRE(scales == 5200);
  auto put = [&](std::size_t at, int from, int to, std::uint8_t v) { for (int i = from; i < to; ++i) expect[at + i] = v; };
  put(data, 0, 64, 0x00);
  put(data, 64, 65, 0x78); put(data, 65, 128, 0x70);
  put(data, 128, 129, 0x7E); put(data, 129, 192, 0xFE);
  put(data, 192, 193, 0xF8); put(data, 193, 256, 0x28);
  put(data, 256, 320, 0x7C);
  for (int i = 320; i < 384; ++i) expect[data + i] = (i % 2) ? 0xF8 : 0x78;
  put(data, 384, 447, 0x44); put(data, 447, 448, 0x7C);
  for (int i = 0; i < 64; ++i) { expect[data + 448 + 2 * i] = 0x00; expect[data + 449 + 2 * i] = 0x3F; }
  expect[data + 448] = 0x80; expect[data + 449] = 0x3F;
  expect[data + 450] = 0x00; expect[data + 451] = 0xC0;
  expect[data + 452] = 0x80; expect[data + 453] = 0x3F;
  const std::uint8_t sc[8] = {105, 119, 127, 129, 120, 109, 125, 0};  // last = pad byte, written as 0
  for (int k = 0; k < 8; ++k) expect[scales + k] = sc[k];

  for (std::size_t i = 0; i < buf.size(); ++i) {
    INFO("byte " << i);
    REQUIRE(int(buf[i]) == int(expect[i]));
  }

  // And back.
  const std::vector<float> y = dequant(cache, 6);
  std::vector<float> want(512);
  for (int i = 0; i < 64; ++i) want[i] = 0.0f;
  want[64] = 1.0f; for (int i = 65; i < 128; ++i) want[i] = 0.5f;
  want[128] = 448.0f; for (int i = 129; i < 192; ++i) want[i] = -448.0f;
  want[192] = -1024.0f; for (int i = 193; i < 256; ++i) want[i] = 1.0f;
  for (int i = 256; i < 320; ++i) want[i] = 3.0f;
  for (int i = 320; i < 384; ++i) want[i] = (i % 2) ? -0x1p-10f : 0x1p-10f;
  for (int i = 384; i < 447; ++i) want[i] = 0.75f;
  want[447] = 96.0f;
  for (int i = 448; i < 512; ++i) want[i] = 0.5f;
  want[448] = 1.0f; want[449] = -2.0f; want[450] = 1.0f;
  for (int i = 0; i < 512; ++i) {
    INFO("dim " << i);
    REQUIRE(y[i] == want[i]);
  }
}

TEST_CASE("fp8_ds_mla: insert touches only its own token, slots are bounds-checked", "[ds4][quant]") {
  std::vector<std::uint8_t> buf(2 * 2880, 0x00);
  const ds4::PagedCache cache{buf.data(), 4, 2, 2880};
  std::vector<float> x(512, 1.0f);
  for (int slot = 0; slot < 8; ++slot) {
    ref::quantize_insert(x.data(), cache, slot);
    x.assign(512, static_cast<float>(slot + 2));
  }
  for (int slot = 0; slot < 8; ++slot) {
    const std::vector<float> y = dequant(cache, slot);
    const float v = slot == 0 ? 1.0f : static_cast<float>(slot + 1);
    for (int d = 0; d < 512; ++d) REQUIRE(y[d] == v);
  }
  // Stride padding (bytes [4*584, 2880) of each block) is never written.
  for (int blk = 0; blk < 2; ++blk) {
    for (int i = 4 * 584; i < 2880; ++i) REQUIRE(buf[blk * 2880 + i] == 0);
  }
  CHECK_THROWS_AS(ref::quantize_insert(x.data(), cache, 8), std::invalid_argument);
  CHECK_THROWS_WITH(ref::quantize_insert(x.data(), cache, -1), Contains("-1") && Contains("8"));
  CHECK_THROWS_AS(ref::dequantize_row(cache, 8, x.data()), std::invalid_argument);
  const ds4::PagedCache narrow{buf.data(), 4, 2, 2000};
  CHECK_THROWS_WITH(ref::quantize_insert(x.data(), narrow, 0), Contains("2000") && Contains("2336"));
}

TEST_CASE("fp8_ds_mla: round-trip error bounds per tile", "[ds4][quant]") {
  std::vector<std::uint8_t> buf(ds4::block_stride_bytes(16), 0);
  const ds4::PagedCache cache{buf.data(), 16, 1, ds4::block_stride_bytes(16)};
  TestRng rng(3);
  for (int slot = 0; slot < 16; ++slot) {
    std::vector<float> x(512);
    for (int k = 0; k < 8; ++k) {
      const double mag = std::pow(10.0, (slot + k) % 9 - 5);  // 1e-5 .. 1e3 per tile
      for (int i = 0; i < 64; ++i) x[k * 64 + i] = static_cast<float>(mag * rng.normal());
    }
    if (slot == 5) x[70] = 5000.0f;  // one outlier dominates its tile
    ref::quantize_insert(x.data(), cache, slot);
    const std::vector<float> y = dequant(cache, slot);
    const std::uint8_t* sc = buf.data() + 16 * 576 + slot * 8;
    for (int k = 0; k < 7; ++k) {
      double amax = 1e-4f;
      for (int i = 0; i < 64; ++i) amax = std::max(amax, std::fabs(static_cast<double>(x[k * 64 + i])));
      int e = -200;
      while (448.0 * std::exp2(e) < amax) ++e;  // smallest e with 448 * 2^e >= amax
      INFO("slot " << slot << " tile " << k);
      REQUIRE(int(sc[k]) == e + 127);
      for (int i = 0; i < 64; ++i) {
        const double xi = x[k * 64 + i], yi = y[k * 64 + i];
        REQUIRE(std::fabs(yi - xi) <= std::max(std::fabs(xi) * 0x1p-4, std::exp2(e - 10)));
        REQUIRE(ref::bf16_to_float(ref::bf16_from_float(y[k * 64 + i])) == y[k * 64 + i]);  // bf16-exact
      }
    }
    REQUIRE(sc[7] == 0);
    for (int i = 448; i < 512; ++i) REQUIRE(std::fabs(y[i] - x[i]) <= std::fabs(x[i]) * 0x1p-8);  // bf16 half ulp
  }
}

// ============================================ compressor =========================================

namespace {
// Direct double formula: per-channel softmax over explicit (token, channel offset) slots.
std::vector<double> compress_direct(const std::vector<float>& kv, const std::vector<float>& sc, int row,
                                    const std::vector<std::pair<int, int>>& slots) {
  std::vector<double> out(512);
  for (int d = 0; d < 512; ++d) {
    double m = -INFINITY;
    for (auto [t, off] : slots) m = std::max(m, static_cast<double>(sc[t * row + off + d]));
    double z = 0, acc = 0;
    for (auto [t, off] : slots) {
      const double w = std::exp(static_cast<double>(sc[t * row + off + d]) - m);
      z += w;
      acc += w * kv[t * row + off + d];
    }
    out[d] = acc / z;
  }
  return out;
}
}  // namespace

TEST_CASE("compressor: C128 rows are per-channel softmax pools of their 128 tokens", "[ds4][compressor]") {
  const int tokens = 3 * 128;
  std::vector<float> kv(tokens * 512), sc(tokens * 512);
  TestRng rng(5);
  for (auto& v : kv) v = rng.normal();
  for (auto& v : sc) v = 2 * rng.normal();
  for (int t = 0; t < tokens; ++t) sc[t * 512 + 7] += 150.0f * static_cast<float>(t % 3);  // needs max-subtraction
  for (int j : {0, 2}) {
    std::vector<std::pair<int, int>> slots;
    for (int t = 128 * j; t < 128 * j + 128; ++t) slots.push_back({t, 0});
    const std::vector<double> want = compress_direct(kv, sc, 512, slots);
    std::vector<float> got(512);
    ref::compress_row(128, j, kv.data(), sc.data(), got.data());
    for (int d = 0; d < 512; ++d) {
      INFO("j " << j << " d " << d);
      REQUIRE(got[d] == Approx(want[d]).margin(1e-6).epsilon(1e-5));
    }
  }
  std::vector<float> dummy(512);
  CHECK_THROWS_AS(ref::compress_row(1, 0, kv.data(), sc.data(), dummy.data()), std::invalid_argument);
  CHECK_THROWS_AS(ref::compress_row(128, -1, kv.data(), sc.data(), dummy.data()), std::invalid_argument);
}

TEST_CASE("compressor: C4 overlap rule, j = 0 masks the previous half", "[ds4][compressor]") {
  const int tokens = 16, row = 1024;
  std::vector<float> kv(tokens * row), sc(tokens * row);
  TestRng rng(9);
  for (auto& v : kv) v = rng.normal();
  for (auto& v : sc) v = rng.normal();
  REQUIRE(ref::compressor_channels(4) == 2);
  REQUIRE(ref::compressor_channels(128) == 1);
  SECTION("j = 0: only tokens 0..3, second half") {
    // Poison what j = 0 must not read: the first half of tokens 0..3 (used only by j = 1).
    for (int t = 0; t < 4; ++t) for (int d = 0; d < 512; ++d) { kv[t * row + d] = 1e6f; sc[t * row + d] = 50.0f; }
    const std::vector<double> want = compress_direct(kv, sc, row, {{0, 512}, {1, 512}, {2, 512}, {3, 512}});
    std::vector<float> got(512);
    ref::compress_row(4, 0, kv.data(), sc.data(), got.data());
    for (int d = 0; d < 512; ++d) REQUIRE(got[d] == Approx(want[d]).margin(1e-6).epsilon(1e-5));
  }
  SECTION("j = 3: tokens 8..11 first half + tokens 12..15 second half") {
    for (int t = 8; t < 12; ++t) for (int d = 512; d < 1024; ++d) { kv[t * row + d] = 1e6f; sc[t * row + d] = 50.0f; }
    for (int t = 12; t < 16; ++t) for (int d = 0; d < 512; ++d) { kv[t * row + d] = 1e6f; sc[t * row + d] = 50.0f; }
    std::vector<std::pair<int, int>> slots;
    for (int t = 8; t < 12; ++t) slots.push_back({t, 0});
    for (int t = 12; t < 16; ++t) slots.push_back({t, 512});
    const std::vector<double> want = compress_direct(kv, sc, row, slots);
    std::vector<float> got(512);
    ref::compress_row(4, 3, kv.data(), sc.data(), got.data());
    for (int d = 0; d < 512; ++d) REQUIRE(got[d] == Approx(want[d]).margin(1e-6).epsilon(1e-5));
  }
}

TEST_CASE("compressor: finalize = RMSNorm(weight) then GPT-J rope at j*r", "[ds4][compressor]") {
  TestRng rng(13);
  const auto [position, theta] = GENERATE(table<int, float>({{0, 10000.0f}, {12, 10000.0f}, {256, 160000.0f}, {65532, 160000.0f}}));
  std::vector<float> x(512), w(512);
  for (auto& v : x) v = 3 * rng.normal();
  for (auto& v : w) v = static_cast<float>(rng.uniform(0.5, 1.5));
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / 512 + 1e-6);
  std::vector<double> want(512);
  for (int d = 0; d < 512; ++d) want[d] = x[d] * inv * w[d];
  for (int i = 0; i < 32; ++i) {
    const double ang = position * std::pow(static_cast<double>(theta), -static_cast<double>(2 * i) / 64.0);
    const double a = want[448 + 2 * i], b = want[449 + 2 * i];
    want[448 + 2 * i] = a * std::cos(ang) - b * std::sin(ang);
    want[449 + 2 * i] = a * std::sin(ang) + b * std::cos(ang);
  }
  ref::compress_finalize(x.data(), w.data(), position, theta);
  INFO("position " << position);
  for (int d = 0; d < 512; ++d) REQUIRE(x[d] == Approx(want[d]).margin(1e-5).epsilon(1e-5));
}

// ============================================ widths, problem ====================================

TEST_CASE("LayerConfig widths are the static capacity sizes", "[ds4][problem]") {
  CHECK(tiny(1).compressed_width() == 0);
  CHECK(tiny(1).combined_width() == 128);
  CHECK(tiny(4).compressed_width() == 8);
  CHECK(tiny(4).combined_width() == 128);
  CHECK(tiny(128).compressed_width() == 128);  // round_up(ceil(512/128) = 4, 128)
  CHECK(tiny(128).combined_width() == 256);    // round_up(128 + 4, 128)
  ds4::LayerConfig flash;  // defaults: C4, W 128, K 512, max_model_len 65536
  CHECK(flash.compressed_width() == 512);
  CHECK(flash.combined_width() == 640);
  flash.ratio = 128;
  CHECK(flash.compressed_capacity() == 512);
  CHECK(flash.compressed_width() == 512);
  CHECK(flash.combined_width() == 640);
  flash.ratio = 1;
  CHECK(flash.combined_width() == 128);
  ds4::LayerConfig pro;
  pro.topk = 1024;
  CHECK(pro.combined_width() == 1152);
  // Capacity invariant (docs/ds4_model.md §4.4): every legal seq_len fits the static sizes.
  for (int r : {1, 4, 128}) {
    const ds4::LayerConfig c = tiny(r);
    for (int L = 0; L <= c.max_model_len; ++L) {
      const int n_c = ds4::visible_compressed(L, r);
      REQUIRE(n_c <= c.compressed_capacity());
      REQUIRE(ds4::swa_len(L, c.window) <= c.window);
      const int topk_len = r == 4 ? std::min(n_c, c.topk) : n_c;
      REQUIRE(topk_len <= c.compressed_width());
      REQUIRE(topk_len + ds4::swa_len(L, c.window) <= c.combined_width());
    }
  }
}

TEST_CASE("make_problem: deterministic, shuffled tables, N(0,1) caches, bf16 q, sink range", "[ds4][problem]") {
  const int r = GENERATE(1, 4, 128);
  const ds4::LayerConfig cfg = tiny(r);
  ds4::DecodeProblem a = ds4::make_problem(cfg, {255, 257}, 42, ds4::Picks::random, 300);
  const ds4::DecodeProblem b = ds4::make_problem(cfg, {255, 257}, 42, ds4::Picks::random, 300);
  const ds4::DecodeProblem c = ds4::make_problem(cfg, {255, 257}, 43, ds4::Picks::random, 300);
  CHECK(a.swa_cache == b.swa_cache);
  CHECK(a.cmp_cache == b.cmp_cache);
  CHECK(a.swa_block_table == b.swa_block_table);
  CHECK(a.cmp_block_table == b.cmp_block_table);
  CHECK(a.topk_local == b.topk_local);
  CHECK(a.q == b.q);
  CHECK(a.sink == b.sink);
  CHECK(a.swa_cache != c.swa_cache);
  CHECK(a.q != c.q);
  CHECK(a.fill_to == 300);
  CHECK(a.batch == 2);

  // SWA table: 32 entries per request, the first ceil(300/16) = 19 a permutation of the 38 blocks.
  REQUIRE(a.swa_blocks_per_req == 32);
  REQUIRE(a.swa_num_blocks == 38);
  std::set<int> used;
  for (int bb = 0; bb < 2; ++bb) {
    for (int k = 0; k < 32; ++k) {
      const int id = a.swa_block_table[bb * 32 + k];
      if (k < 19) used.insert(id); else CHECK(id == -1);
    }
  }
  CHECK(used.size() == 38);
  CHECK(*used.begin() == 0);
  CHECK(*used.rbegin() == 37);
  std::vector<int> identity(19);
  for (int k = 0; k < 19; ++k) identity[k] = k;
  CHECK(std::vector<int>(a.swa_block_table.begin(), a.swa_block_table.begin() + 19) != identity);
  if (r > 1) {
    const int e = 256 / r, cap = 512 / r;
    REQUIRE(a.cmp_blocks_per_req == (cap + e - 1) / e);
    REQUIRE(a.cmp_num_blocks == 2 * ((300 / r + e - 1) / e));
  } else {
    CHECK(a.cmp_cache.empty());
    CHECK(a.topk_local.empty());
  }

  // Cache rows: roughly N(0,1) in both the fp8 and the bf16 part.
  double s = 0, s2 = 0, n = 0;
  for (int bb = 0; bb < 2; ++bb) {
    for (int t = 0; t < 300; ++t) {
      const std::vector<float> y = dequant(a.swa_view(), swa_slot_indep(a, bb, t));
      for (float v : y) { s += v; s2 += static_cast<double>(v) * v; n += 1; }
    }
  }
  CHECK(std::fabs(s / n) < 0.02);
  CHECK(std::fabs(s2 / n - 1.0) < 0.05);
  for (auto qv : a.q) {
    const float f = ref::bf16_to_float(qv);
    REQUIRE(std::isfinite(f));
  }
  for (float sk : a.sink) { CHECK(sk >= -2.0f); CHECK(sk <= 2.0f); }
}

TEST_CASE("make_problem/grow: C4 picks", "[ds4][problem]") {
  const ds4::LayerConfig cfg = tiny(4);
  SECTION("last8: the last min(n_c, K) ids ascending") {
    const ds4::DecodeProblem p = ds4::make_problem(cfg, {17, 257}, 1, ds4::Picks::last8);
    const std::vector<int> r0(p.topk_local.begin(), p.topk_local.begin() + 8);
    const std::vector<int> r1(p.topk_local.begin() + 8, p.topk_local.end());
    CHECK(r0 == std::vector<int>{0, 1, 2, 3, -1, -1, -1, -1});
    CHECK(r1 == std::vector<int>{56, 57, 58, 59, 60, 61, 62, 63});
  }
  SECTION("random: short context = 0..n_c-1; long = K distinct valid ids") {
    const ds4::DecodeProblem p = ds4::make_problem(cfg, {23, 400}, 2);
    const std::vector<int> r0(p.topk_local.begin(), p.topk_local.begin() + 8);
    CHECK(r0 == std::vector<int>{0, 1, 2, 3, 4, -1, -1, -1});  // L = 23: n_c = 5
    const std::set<int> ids(p.topk_local.begin() + 8, p.topk_local.end());
    CHECK(ids.size() == 8);
    CHECK(*ids.begin() >= 0);
    CHECK(*ids.rbegin() < 100);
  }
  SECTION("grow reproduces make_problem's picks and respects fill_to") {
    ds4::DecodeProblem p = ds4::make_problem(cfg, {3, 5}, 7, ds4::Picks::random, 512);
    const ds4::DecodeProblem q = ds4::make_problem(cfg, {300, 512}, 7, ds4::Picks::random, 512);
    ds4::grow(p, {300, 512}, 7);
    CHECK(p.seq_lens == q.seq_lens);
    CHECK(p.topk_local == q.topk_local);
    CHECK(p.swa_cache == q.swa_cache);
    ds4::DecodeProblem small = ds4::make_problem(cfg, {3, 5}, 7);
    CHECK(small.fill_to == 5);
    CHECK_THROWS_WITH(ds4::grow(small, {3, 6}, 7), Contains("6") && Contains("fill_to = 5"));
    CHECK_THROWS_AS(ds4::grow(small, {3}, 7), std::invalid_argument);
  }
}

TEST_CASE("make_problem/validate: bad input throws naming the value and the limit", "[ds4][problem]") {
  const ds4::LayerConfig cfg = tiny(4);
  CHECK_THROWS_WITH(ds4::make_problem(cfg, {5, 513}, 1), Contains("513") && Contains("max_model_len = 512"));
  CHECK_THROWS_WITH(ds4::make_problem(cfg, {-1, 5}, 1), Contains("-1"));
  CHECK_THROWS_WITH(ds4::make_problem(cfg, {5, 9}, 1, ds4::Picks::random, 8), Contains("9") && Contains("fill_to = 8"));
  CHECK_THROWS_WITH(ds4::make_problem(cfg, {5}, 1, ds4::Picks::random, 600), Contains("600") && Contains("512"));
  ds4::LayerConfig bad = cfg;
  bad.ratio = 8;
  CHECK_THROWS_WITH(ds4::make_problem(bad, {5}, 1), Contains("ratio = 8"));

  std::vector<float> out(2 * 4 * 512);
  const ds4::DecodeProblem good = ds4::make_problem(cfg, {17, 40}, 1);
  {
    ds4::DecodeProblem p = good;
    p.topk_local[8] = 10;  // request 1: n_c = 10
    CHECK_THROWS_WITH(ref::sparse_attention(p, out.data()), Contains("= 10") && Contains("n_c = 10"));
  }
  {
    ds4::DecodeProblem p = good;
    p.topk_local[2] = -1;  // request 0 (n_c 4): entry 2 must be valid
    CHECK_THROWS_AS(ref::sparse_attention(p, out.data()), std::invalid_argument);
  }
  {
    ds4::DecodeProblem p = good;
    p.swa_block_table.pop_back();
    CHECK_THROWS_WITH(ref::sparse_attention(p, out.data()), Contains("swa_block_table") && Contains("63"));
  }
  {
    ds4::DecodeProblem p = good;
    p.seq_lens[1] = 600;
    CHECK_THROWS_WITH(ref::sparse_attention(p, out.data()), Contains("600") && Contains("512"));
  }
  {
    ds4::DecodeProblem p = good;
    p.sink.push_back(0.0f);
    CHECK_THROWS_WITH(ref::sparse_attention(p, out.data()), Contains("sink") && Contains("5"));
  }
  {
    ds4::DecodeProblem p = good;
    p.seq_lens[1] = 200;  // beyond the cache rows that exist (fill_to 40): unallocated block -1
    CHECK_THROWS_WITH(ref::sparse_attention(p, out.data()), Contains("-1"));
  }
}

// ============================================ combine / gather ===================================

TEST_CASE("combine_paged handles the tiny-shape edge cases", "[ds4][combine]") {
  const auto picks = GENERATE(ds4::Picks::random, ds4::Picks::last8);
  for (const Case& k : edge_cases()) {
    ds4::DecodeProblem p = ds4::make_problem(tiny(k.ratio), k.lens, 100 + k.ratio, picks);
    const int cw = p.cfg.compressed_width(), W = p.cfg.window;
    std::vector<std::int32_t> cidx(std::max(1, 2 * cw), 77), clen(2, 77), sidx(2 * W, 77), slen(2, 77);
    ref::combine_paged(p, cw ? cidx.data() : nullptr, clen.data(), sidx.data(), slen.data());
    for (int b = 0; b < 2; ++b) {
      const int L = k.lens[b];
      INFO("ratio " << k.ratio << " L " << L);
      // Hand formula for the lengths.
      const int want_c = k.ratio == 4 ? std::min(L / 4, 8) : (k.ratio == 128 ? L / 128 : 0);
      REQUIRE(clen[b] == want_c);
      REQUIRE(slen[b] == std::min(L, 4));
      const std::vector<int> ep = expected_picks(p, b);
      REQUIRE(static_cast<int>(ep.size()) == want_c);
      for (int i = 0; i < cw; ++i) {
        REQUIRE(cidx[b * cw + i] == (i < want_c ? cmp_slot_indep(p, b, ep[i]) : -1));
      }
      const std::vector<int> pos = expected_swa_positions(p, b);
      for (int i = 0; i < W; ++i) {
        REQUIRE(sidx[b * W + i] == (i < slen[b] ? swa_slot_indep(p, b, pos[i]) : -1));
      }
      if (L == 0) {
        REQUIRE(clen[b] == 0);
        REQUIRE(slen[b] == 0);
      }
    }
  }
  // A concrete hand case: C4, L = 17 -> SWA positions 13..16, n_c = 4.
  ds4::DecodeProblem p = ds4::make_problem(tiny(4), {17, 0}, 5, ds4::Picks::last8);
  std::vector<std::int32_t> cidx(16), clen(2), sidx(8), slen(2);
  ref::combine_paged(p, cidx.data(), clen.data(), sidx.data(), slen.data());
  const int blk = p.swa_block_table[0];  // positions 13..16: 13,14,15 in block 0, 16 in block 1
  CHECK(sidx[0] == blk * 16 + 13);
  CHECK(sidx[2] == blk * 16 + 15);
  CHECK(sidx[3] == p.swa_block_table[1] * 16 + 0);
  CHECK(cidx[0] == p.cmp_block_table[0] * 64 + 0);
  CHECK(cidx[3] == p.cmp_block_table[0] * 64 + 3);
  CHECK(cidx[4] == -1);
  CHECK(std::vector<int>(sidx.begin() + 4, sidx.end()) == std::vector<int>{-1, -1, -1, -1});
}

TEST_CASE("combine_gather + gather_workspace: layout, rows and indices", "[ds4][combine]") {
  for (const Case& k : edge_cases()) {
    ds4::DecodeProblem p = ds4::make_problem(tiny(k.ratio), k.lens, 200 + k.ratio);
    const int N = p.cfg.compressed_capacity(), W = p.cfg.window, M = N + W, width = p.cfg.combined_width();
    std::vector<float> ws(2 * M * 512, -7.0f);
    std::vector<std::int32_t> idx(2 * width, 77), len(2, 77);
    ref::gather_workspace(p, N, M, ws.data());
    ref::combine_gather(p, N, M, idx.data(), len.data());
    for (int b = 0; b < 2; ++b) {
      const int L = k.lens[b];
      const int n_c = k.ratio > 1 ? L / k.ratio : 0, g = std::min(L, W);
      INFO("ratio " << k.ratio << " L " << L);
      // Workspace: ALL n_c compressed rows at offset 0, SWA rows at offset N, zeros elsewhere.
      for (int r = 0; r < M; ++r) {
        const float* row = ws.data() + (b * M + r) * 512;
        std::vector<float> want(512, 0.0f);
        if (r < n_c) want = dequant(p.cmp_view(), cmp_slot_indep(p, b, r));
        if (r >= N && r - N < g) want = dequant(p.swa_view(), swa_slot_indep(p, b, L - g + (r - N)));
        REQUIRE(std::equal(want.begin(), want.end(), row));
      }
      // Indices: [b*M + c for picks] ++ [b*M + N + i], then -1.
      std::vector<int> want;
      for (int c : expected_picks(p, b)) want.push_back(b * M + c);
      for (int i = 0; i < g; ++i) want.push_back(b * M + N + i);
      REQUIRE(len[b] == static_cast<int>(want.size()));
      want.resize(width, -1);
      REQUIRE(std::vector<int>(idx.begin() + b * width, idx.begin() + (b + 1) * width) == want);
    }
  }
}

TEST_CASE("combine_gather + gather_workspace, both layouts: capture-time sizes that cannot hold a grown batch "
          "are rejected (the seed bug)",
          "[ds4][combine][ragged]") {
  // Both layouts reserve B*M rows and keep n_c(b) <= N and min(L_b, W) <= M - N for every request,
  // so the same frozen sizes must be refused by both, by the index build and by the gather alike.
  struct Layout {
    const char* name;
    void (*combine)(const ds4::DecodeProblem&, int, int, std::int32_t*, std::int32_t*);
    void (*gather)(const ds4::DecodeProblem&, int, int, float*);
  };
  const Layout layouts[] = {{"strided", ref::combine_gather, ref::gather_workspace},
                            {"ragged", ref::combine_gather_ragged, ref::gather_workspace_ragged}};
  std::vector<float> ws(2 * 132 * 512);  // B * M * 512 at the largest sizes below
  std::vector<std::int32_t> idx(1024), len(2);
  // docs/ds4_model.md §4.3 worked example, W = 4: sizes frozen at seq_lens [3,5], replayed longer.
  const ds4::DecodeProblem c4 = ds4::make_problem(tiny(4), {15, 17}, 1);        // captured N = 1, M = 5
  const ds4::DecodeProblem c128 = ds4::make_problem(tiny(128), {255, 257}, 1);  // captured N = 0, M = 4
  const ds4::DecodeProblem c1 = ds4::make_problem(tiny(1), {3, 5}, 1);          // dummy capture L = 1: G = 1
  for (const Layout& lay : layouts) {
    INFO("layout " << lay.name);
    CHECK_THROWS_WITH(lay.combine(c4, 1, 5, idx.data(), len.data()), Contains("n_c = 3") && Contains("N = 1"));
    CHECK_THROWS_WITH(lay.gather(c4, 1, 5, ws.data()), Contains("n_c = 3") && Contains("N = 1"));
    CHECK_THROWS_WITH(lay.combine(c128, 0, 4, idx.data(), len.data()), Contains("n_c = 1") && Contains("N = 0"));
    CHECK_THROWS_WITH(lay.gather(c128, 0, 4, ws.data()), Contains("n_c = 1") && Contains("N = 0"));
    CHECK_THROWS_WITH(lay.combine(c1, 0, 1, idx.data(), len.data()), Contains("swa_len = 3") && Contains("M - N = 1"));
    CHECK_THROWS_WITH(lay.gather(c1, 0, 1, ws.data()), Contains("swa_len = 3") && Contains("M - N = 1"));
    // The capacity sizes of docs/ds4_model.md §4.4 hold them.
    CHECK_NOTHROW(lay.combine(c4, 128, 132, idx.data(), len.data()));
    CHECK_NOTHROW(lay.gather(c4, 128, 132, ws.data()));
    CHECK_NOTHROW(lay.combine(c128, 4, 8, idx.data(), len.data()));
    CHECK_NOTHROW(lay.gather(c128, 4, 8, ws.data()));
    CHECK_NOTHROW(lay.combine(c1, 0, 4, idx.data(), len.data()));
    CHECK_NOTHROW(lay.gather(c1, 0, 4, ws.data()));
  }
}

TEST_CASE("ragged gather layout: the strided layout's rows packed request after request, same order",
          "[ds4][combine][ragged]") {
  std::vector<Case> cases = edge_cases();
  for (int r : {1, 4, 128}) cases.push_back({r, {0, 17, 5, 0, 512, 3, 130, 1}});  // padded slots between
  for (const Case& k : cases) {
    for (const bool tight : {false, true}) {
      ds4::DecodeProblem p = ds4::make_problem(tiny(k.ratio), k.lens, 500 + k.ratio);
      const int B = p.batch, W = p.cfg.window, width = p.cfg.combined_width();
      int N = p.cfg.compressed_capacity(), G = W;
      if (tight) {  // exact-fit sizes: the ragged rows still fit B*M
        N = 0, G = 0;
        for (int L : k.lens) N = std::max(N, ds4::visible_compressed(L, k.ratio)), G = std::max(G, std::min(L, W));
      }
      const int M = N + G;
      INFO("ratio " << k.ratio << " batch " << B << " lens[1] " << k.lens[1] << " N " << N << " M " << M);
      std::vector<float> ws_s(static_cast<std::size_t>(B) * M * 512, -7.0f), ws_r(ws_s.size(), -7.0f);
      std::vector<std::int32_t> idx_s(B * width, 77), idx_r(B * width, 77), len_s(B, 77), len_r(B, 77);
      ref::gather_workspace(p, N, M, ws_s.data());
      ref::combine_gather(p, N, M, idx_s.data(), len_s.data());
      ref::gather_workspace_ragged(p, N, M, ws_r.data());
      ref::combine_gather_ragged(p, N, M, idx_r.data(), len_r.data());
      auto row = [](const std::vector<float>& ws, std::int64_t r) { return ws.begin() + r * 512; };
      std::int64_t row0 = 0;
      for (int b = 0; b < B; ++b) {
        const int L = k.lens[b];
        const int n_c = k.ratio > 1 ? L / k.ratio : 0, g = std::min(L, W);
        REQUIRE(ref::ragged_row0(p, b) == row0);
        // Rows: compressed c at row0 + c, SWA i at row0 + n_c + i -- the strided rows b*M + c, b*M + N + i.
        for (int c = 0; c < n_c; ++c)
          REQUIRE(std::equal(row(ws_s, std::int64_t(b) * M + c), row(ws_s, std::int64_t(b) * M + c) + 512, row(ws_r, row0 + c)));
        for (int i = 0; i < g; ++i)
          REQUIRE(std::equal(row(ws_s, std::int64_t(b) * M + N + i), row(ws_s, std::int64_t(b) * M + N + i) + 512,
                             row(ws_r, row0 + n_c + i)));
        // Indices: [row0 + c for picks] ++ [row0 + n_c + i], then -1; the same lengths.
        std::vector<int> want;
        for (int c : expected_picks(p, b)) want.push_back(static_cast<int>(row0) + c);
        for (int i = 0; i < g; ++i) want.push_back(static_cast<int>(row0) + n_c + i);
        REQUIRE(len_r[b] == static_cast<int>(want.size()));
        REQUIRE(len_r[b] == len_s[b]);
        want.resize(width, -1);
        REQUIRE(std::vector<int>(idx_r.begin() + b * width, idx_r.begin() + (b + 1) * width) == want);
        // Request b attends the same row contents in the same order in both layouts.
        for (int i = 0; i < len_r[b]; ++i) {
          const std::int64_t rs = idx_s[b * width + i], rr = idx_r[b * width + i];
          REQUIRE(std::equal(row(ws_s, rs), row(ws_s, rs) + 512, row(ws_r, rr)));
        }
        row0 += n_c + g;
      }
      REQUIRE(ref::ragged_rows(p) == row0);
      REQUIRE(ref::ragged_row0(p, B) == row0);
      REQUIRE(row0 <= std::int64_t(B) * M);  // n_c <= N and swa_len <= G: the packed rows fit B*M
      for (std::size_t e = static_cast<std::size_t>(row0) * 512; e < ws_r.size(); ++e) REQUIRE(ws_r[e] == 0.0f);
      // The gather-path attention over either layout is the same fp32 computation: equal exactly.
      std::vector<float> a_s(static_cast<std::size_t>(B) * 4 * 512), a_r(a_s.size());
      ref::attention_over_workspace(p, ws_s.data(), std::int64_t(B) * M, idx_s.data(), len_s.data(), width, a_s.data());
      ref::attention_over_workspace(p, ws_r.data(), std::int64_t(B) * M, idx_r.data(), len_r.data(), width, a_r.data());
      REQUIRE(a_r == a_s);
    }
  }
  // A hand case: C4, W = 4, lens {17, 5, 0, 9}: rows 4+4, 1+4, 0, 2+4 -> row0 = 0, 8, 13, 13; 19 rows.
  ds4::DecodeProblem h = ds4::make_problem(tiny(4), {17, 5, 0, 9}, 3, ds4::Picks::last8);
  CHECK(ref::ragged_row0(h, 0) == 0);
  CHECK(ref::ragged_row0(h, 1) == 8);
  CHECK(ref::ragged_row0(h, 2) == 13);
  CHECK(ref::ragged_row0(h, 3) == 13);
  CHECK(ref::ragged_rows(h) == 19);
  std::vector<std::int32_t> idx(4 * 128), len(4);
  ref::combine_gather_ragged(h, 128, 132, idx.data(), len.data());
  CHECK(std::vector<int>(idx.begin() + 128, idx.begin() + 128 + 6) == std::vector<int>{8, 9, 10, 11, 12, -1});
  CHECK(len == std::vector<std::int32_t>{8, 5, 0, 6});
  CHECK(idx[256] == -1);
  CHECK_THROWS_WITH(ref::ragged_row0(h, 5), Contains("b = 5") && Contains("batch = 4"));
  CHECK_THROWS_WITH(ref::ragged_row0(h, -1), Contains("b = -1"));
}

// ============================================ attention ==========================================

TEST_CASE("sparse_attention agrees with a naive double recomputation on the edge cases", "[ds4][attention]") {
  for (const Case& k : edge_cases()) {
    ds4::DecodeProblem p = ds4::make_problem(tiny(k.ratio), k.lens, 300 + k.ratio);
    std::vector<float> out(2 * 4 * 512);
    ref::sparse_attention(p, out.data());
    for (int b = 0; b < 2; ++b) {
      const std::vector<double> want = naive_attention(p, b, attended_rows(p, b));
      INFO("ratio " << k.ratio << " L " << k.lens[b]);
      for (int i = 0; i < 4 * 512; ++i) REQUIRE(out[b * 4 * 512 + i] == Approx(want[i]).margin(1e-5).epsilon(1e-5));
      if (k.lens[b] == 0) {
        for (int i = 0; i < 4 * 512; ++i) REQUIRE(out[b * 4 * 512 + i] == 0.0f);
      }
    }
  }
}

TEST_CASE("sparse_attention: invalid token gives exactly zero output", "[ds4][attention]") {
  const int r = GENERATE(1, 4, 128);
  ds4::DecodeProblem p = ds4::make_problem(tiny(r), {0, 257}, 8);
  for (int i = 0; i < 4 * 512; ++i) p.q[i] = 0x7FC0;  // NaN queries for the padded token must not leak
  std::vector<float> out(2 * 4 * 512, 123.0f);
  ref::sparse_attention(p, out.data());
  for (int i = 0; i < 4 * 512; ++i) REQUIRE(out[i] == 0.0f);
  bool nonzero = false;
  for (int i = 4 * 512; i < 8 * 512; ++i) { REQUIRE(std::isfinite(out[i])); nonzero |= out[i] != 0.0f; }
  CHECK(nonzero);
}

TEST_CASE("sparse_attention: sink -inf is a no-op, finite sink scales by 1/(1+exp(sink-lse)), +inf zeroes",
          "[ds4][attention]") {
  const int r = GENERATE(1, 4, 128);
  ds4::DecodeProblem p = ds4::make_problem(tiny(r), {5, 300}, 9);
  std::vector<float> no_sink(2 * 4 * 512), with_sink(2 * 4 * 512), inf_sink(2 * 4 * 512);
  const std::vector<float> sinks = {-1.5f, 0.0f, 2.0f, 6.0f};
  p.sink.assign(4, -INFINITY);
  ref::sparse_attention(p, no_sink.data());
  p.sink = sinks;
  ref::sparse_attention(p, with_sink.data());
  p.sink.assign(4, INFINITY);
  ref::sparse_attention(p, inf_sink.data());
  for (int b = 0; b < 2; ++b) {
    std::vector<double> lse;
    naive_attention(p, b, attended_rows(p, b), &lse);
    for (int h = 0; h < 4; ++h) {
      const double f = 1.0 / (1.0 + std::exp(sinks[h] - lse[h]));
      INFO("b " << b << " h " << h << " factor " << f);
      REQUIRE(f < 1.0);
      for (int d = 0; d < 512; ++d) {
        const int i = (b * 4 + h) * 512 + d;
        REQUIRE(with_sink[i] == Approx(no_sink[i] * f).margin(1e-6).epsilon(1e-5));
        REQUIRE(inf_sink[i] == 0.0f);
      }
    }
  }
}

TEST_CASE("sparse_attention: a single attended row comes back unchanged", "[ds4][attention]") {
  const int r = GENERATE(1, 4, 128);  // L = 1: one SWA row, n_c = 0
  ds4::DecodeProblem p = ds4::make_problem(tiny(r), {1, 1}, 10);
  p.sink.assign(4, -INFINITY);
  std::vector<float> out(2 * 4 * 512);
  ref::sparse_attention(p, out.data());
  for (int b = 0; b < 2; ++b) {
    const std::vector<float> row = dequant(p.swa_view(), swa_slot_indep(p, b, 0));
    for (int h = 0; h < 4; ++h) {
      for (int d = 0; d < 512; ++d) REQUIRE(out[(b * 4 + h) * 512 + d] == row[d]);
    }
  }
}

TEST_CASE("gather path (gather_workspace + combine_gather + attention_over_workspace) equals sparse_attention",
          "[ds4][attention]") {
  const bool tight = GENERATE(false, true);
  for (const Case& k : edge_cases()) {
    ds4::DecodeProblem p = ds4::make_problem(tiny(k.ratio), k.lens, 400 + k.ratio);
    int N = p.cfg.compressed_capacity(), G = p.cfg.window;
    if (tight) {  // exact-fit sizes (what eager mode computes): still a correct layout
      N = 0; G = 0;
      for (int L : k.lens) { N = std::max(N, ds4::visible_compressed(L, k.ratio)); G = std::max(G, std::min(L, 4)); }
    }
    const int M = N + G, width = p.cfg.combined_width();
    std::vector<float> ws(static_cast<std::size_t>(2 * M) * 512 + 1);
    std::vector<std::int32_t> idx(2 * width), len(2);
    ref::gather_workspace(p, N, M, ws.data());
    ref::combine_gather(p, N, M, idx.data(), len.data());
    std::vector<float> a(2 * 4 * 512), b(2 * 4 * 512);
    ref::attention_over_workspace(p, ws.data(), 2 * M, idx.data(), len.data(), width, a.data());
    ref::sparse_attention(p, b.data());
    INFO("ratio " << k.ratio << " lens " << k.lens[0] << "," << k.lens[1] << " N " << N << " M " << M);
    for (std::size_t i = 0; i < a.size(); ++i) REQUIRE(a[i] == Approx(b[i]).margin(1e-5).epsilon(1e-5));
  }
}

TEST_CASE("attention_over_workspace: -1 and out-of-range entries are skipped, lens are checked", "[ds4][attention]") {
  ds4::DecodeProblem p = ds4::make_problem(tiny(1), {5, 3}, 11);
  const int N = 0, M = 4, width = 128;
  std::vector<float> ws(2 * M * 512);
  std::vector<std::int32_t> idx(2 * width), len(2);
  ref::gather_workspace(p, N, M, ws.data());
  ref::combine_gather(p, N, M, idx.data(), len.data());
  std::vector<float> want(2 * 4 * 512), got(2 * 4 * 512);
  ref::attention_over_workspace(p, ws.data(), 2 * M, idx.data(), len.data(), width, want.data());
  // Append invalid entries inside the length: they must change nothing.
  idx[len[0]] = -1; idx[len[0] + 1] = 2 * M; len[0] += 2;
  ref::attention_over_workspace(p, ws.data(), 2 * M, idx.data(), len.data(), width, got.data());
  CHECK(got == want);
  len[1] = width + 1;
  CHECK_THROWS_WITH(ref::attention_over_workspace(p, ws.data(), 2 * M, idx.data(), len.data(), width, got.data()),
                    Contains("129") && Contains("128"));
}

TEST_CASE("query_rows_problem: token t of request b attends b's rows up to position L_b - s_q + t", "[ds4][mtp]") {
  const std::vector<std::int32_t> lens = {0, 1, 2, 3, 5, 17, 255, 257, 512};
  for (const int ratio : {1, 4, 128})
    for (const int s_q : {1, 2, 3}) {
      INFO("ratio " << ratio << " s_q " << s_q);
      const ds4::LayerConfig c = tiny(ratio);
      const ds4::DecodeProblem p = ds4::make_problem(c, lens, 7 + ratio);
      const ds4::DecodeProblem rows = ds4::query_rows_problem(p, s_q, 9);
      REQUIRE(rows.batch == p.batch * s_q);
      const int R = rows.batch, W = c.window, cw = c.compressed_width();
      std::vector<std::int32_t> ci(static_cast<std::size_t>(R) * std::max(cw, 1), -1), cl(R), si(static_cast<std::size_t>(R) * W), sl(R);
      ref::combine_paged(rows, ratio > 1 ? ci.data() : nullptr, cl.data(), si.data(), sl.data());
      for (int b = 0; b < p.batch; ++b)
        for (int t = 0; t < s_q; ++t) {
          const int r = b * s_q + t;
          const int pos = lens[b] - s_q + t;  // the token's position; < 0: no token
          const int n = lens[b] == 0 || pos < 0 ? 0 : std::min(pos + 1, W);
          REQUIRE(sl[r] == n);
          for (int i = 0; i < n; ++i) CHECK(si[static_cast<std::size_t>(r) * W + i] == ref::swa_slot(p, b, pos - n + 1 + i));
          if (ratio == 128) {  // every visible compressed row of the token, through request b's table
            const int n_c = lens[b] == 0 || pos < 0 ? 0 : (pos + 1) / ratio;
            REQUIRE(cl[r] == n_c);
            for (int j = 0; j < n_c; ++j) CHECK(ci[static_cast<std::size_t>(r) * cw + j] == ref::compressed_slot(p, b, j));
          }
          if (ratio == 4) {  // picks of the row's own n_c, read through request b's table
            const int n_c = lens[b] == 0 || pos < 0 ? 0 : (pos + 1) / ratio;
            REQUIRE(cl[r] == std::min(n_c, c.topk));
            for (int i = 0; i < cl[r]; ++i) {
              const int id = rows.topk_local[static_cast<std::size_t>(r) * c.topk + i];
              CHECK(id < n_c);
              CHECK(ci[static_cast<std::size_t>(r) * cw + i] == ref::compressed_slot(p, b, id));
            }
          }
        }
      if (s_q == 1) {  // one token: the same problem, the same attention bit for bit
        const ds4::DecodeProblem same = ds4::query_rows_problem(p, 1, 7 + ratio);
        std::vector<float> a(static_cast<std::size_t>(p.batch) * c.heads * 512), b(a.size());
        ref::sparse_attention(p, a.data());
        ref::sparse_attention(same, b.data());
        CHECK(a == b);
      }
    }
  CHECK_THROWS_WITH(ds4::query_token_rows({3}, 0), Contains("query_tokens = 0"));
  CHECK_THROWS_WITH(ds4::query_token_rows({-1}, 2), Contains("seq_lens[0] = -1"));
}
