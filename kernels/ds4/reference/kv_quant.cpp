// fp8_ds_mla (V4 "MODEL1") quantize/insert and dequantize of one 512-wide row. docs/ds4_model.md §3.1.
#include <graphsafe/ds4/reference.hpp>

#include "detail.hpp"

#include <cmath>

namespace graphsafe::ds4::ref {

int ue8m0_exponent(float amax) {
  const float a = (amax >= kAmaxFloor) ? amax : kAmaxFloor;  // NaN fails the test -> floor
  const float r = a / kFp8Max;
  if (std::isinf(r)) return 128;
  int e2 = 0;
  const float f = std::frexp(r, &e2);  // r = f * 2^e2, f in [0.5, 1)
  return f == 0.5f ? e2 - 1 : e2;      // exact ceil(log2(r))
}

namespace {

// Base pointer of the block holding `slot` and the in-block token index; validates everything.
std::uint8_t* locate(const PagedCache& cache, std::int64_t slot, int& t) {
  if (cache.block_tokens <= 0) detail::fail("PagedCache.block_tokens = ", cache.block_tokens, " must be > 0");
  if (cache.num_blocks < 0) detail::fail("PagedCache.num_blocks = ", cache.num_blocks, " must be >= 0");
  const std::size_t need = static_cast<std::size_t>(cache.block_tokens) * kTokenBytes;
  if (cache.stride < need) {
    detail::fail("PagedCache.stride = ", cache.stride, " is below block_tokens*584 = ", need);
  }
  const std::int64_t slots = static_cast<std::int64_t>(cache.num_blocks) * cache.block_tokens;
  if (slot < 0 || slot >= slots) {
    detail::fail("slot = ", slot, " outside the cache's [0, ", slots, ") (num_blocks = ",
                 cache.num_blocks, ", block_tokens = ", cache.block_tokens, ")");
  }
  if (cache.base == nullptr) detail::fail("PagedCache.base is null");
  t = static_cast<int>(slot % cache.block_tokens);
  return cache.base + static_cast<std::size_t>(slot / cache.block_tokens) * cache.stride;
}

}  // namespace

void quantize_insert(const float* row512, const PagedCache& cache, std::int64_t slot) {
  int t = 0;
  std::uint8_t* blk = locate(cache, slot, t);
  std::uint8_t* data = blk + token_data_offset(cache.block_tokens, t);
  std::uint8_t* scales = blk + token_scale_offset(cache.block_tokens, t);
  for (int k = 0; k < kNumTiles; ++k) {
    const float* x = row512 + k * kTileWidth;
    float amax = 0.0f;
    for (int i = 0; i < kTileWidth; ++i) {
      const float a = std::fabs(x[i]);
      if (a > amax) amax = a;  // NaN never compares greater: ignored
    }
    int e = ue8m0_exponent(amax) + kScaleBias;
    e = e < 0 ? 0 : (e > 255 ? 255 : e);
    scales[k] = static_cast<std::uint8_t>(e);
    // 2^-(byte-127) is exactly representable for every byte (2^-128 .. 2^127), so x * inv is the
    // correctly rounded x / 2^e.
    const float inv = std::ldexp(1.0f, kScaleBias - e);
    for (int i = 0; i < kTileWidth; ++i) {
      float v = x[i] * inv;
      if (v > kFp8Max) v = kFp8Max;
      if (v < -kFp8Max) v = -kFp8Max;
      data[k * kTileWidth + i] = fp8_e4m3_from_float(v);
    }
  }
  scales[kNumTiles] = 0;  // pad byte
  for (int i = 0; i < kRopeDim; ++i) {
    const std::uint16_t b = bf16_from_float(row512[kNopeDim + i]);
    data[kNopeDim + 2 * i] = static_cast<std::uint8_t>(b & 0xFFu);
    data[kNopeDim + 2 * i + 1] = static_cast<std::uint8_t>(b >> 8);
  }
}

void dequantize_row(const PagedCache& cache, std::int64_t slot, float* out512) {
  int t = 0;
  const std::uint8_t* blk = locate(cache, slot, t);
  const std::uint8_t* data = blk + token_data_offset(cache.block_tokens, t);
  const std::uint8_t* scales = blk + token_scale_offset(cache.block_tokens, t);
  for (int k = 0; k < kNumTiles; ++k) {
    const int e = static_cast<int>(scales[k]) - kScaleBias;
    if (e <= 127) {
      const float s = std::ldexp(1.0f, e);  // exact power of two (2^-127 is a float subnormal)
      for (int i = 0; i < kTileWidth; ++i) out512[k * kTileWidth + i] = fp8_e4m3_to_float(data[k * kTileWidth + i]) * s;
    } else {  // byte 255: 2^128 is not a float; scale each value on its own
      for (int i = 0; i < kTileWidth; ++i) out512[k * kTileWidth + i] = std::ldexp(fp8_e4m3_to_float(data[k * kTileWidth + i]), e);
    }
  }
  for (int i = 0; i < kRopeDim; ++i) {
    const auto b = static_cast<std::uint16_t>(data[kNopeDim + 2 * i] | (data[kNopeDim + 2 * i + 1] << 8));
    out512[kNopeDim + i] = bf16_to_float(b);
  }
}

}  // namespace graphsafe::ds4::ref
