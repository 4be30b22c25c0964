// DS4 ("DeepSeek V4") KV-cache byte layout: the single source of truth shared by the CUDA kernels
// and the CPU reference. Everything here is docs/ds4_model.md §3.1 ("fp8_ds_mla", MODEL1 flavour).
#pragma once

#include <cstddef>
#include <cstdint>

namespace graphsafe::ds4 {

// One latent row is both K and V (MQA with one KV head).
inline constexpr int kHeadDim = 512;    // D
inline constexpr int kNopeDim = 448;    // quantized part: 7 tiles of 64
inline constexpr int kRopeDim = 64;     // stored as raw bf16
inline constexpr int kTileWidth = 64;   // one UE8M0 scale per 64-wide tile
inline constexpr int kNumTiles = kNopeDim / kTileWidth;  // 7

// Bytes of one token inside a paged block.
inline constexpr int kTokenDataBytes = kNopeDim + 2 * kRopeDim;  // 448 fp8 + 128 B bf16 = 576
inline constexpr int kTokenScaleBytes = 8;                        // 7 exponent bytes + 1 pad
inline constexpr int kTokenBytes = kTokenDataBytes + kTokenScaleBytes;  // 584

// FlashMLA requires the block stride to be a multiple of 576 bytes (TMA_K_STRIDE).
inline constexpr std::size_t kBlockStrideAlign = kTokenDataBytes;

// Block of `block_tokens` tokens: [0, bs*576) token data (token t at t*576: 448 B fp8 nope then
// 128 B bf16 rope), then [bs*576, bs*584) scales (token t at bs*576 + t*8). Stride padded to 576.
constexpr std::size_t block_stride_bytes(int block_tokens) {
  const std::size_t raw = static_cast<std::size_t>(block_tokens) * kTokenBytes;
  return (raw + kBlockStrideAlign - 1) / kBlockStrideAlign * kBlockStrideAlign;
}
static_assert(block_stride_bytes(64) == 37440, "docs/ds4_model.md §3.1: bs=64 -> 37376 B padded to 37440 B");

constexpr std::size_t token_data_offset(int block_tokens, int t) {
  (void)block_tokens;
  return static_cast<std::size_t>(t) * kTokenDataBytes;
}
constexpr std::size_t token_scale_offset(int block_tokens, int t) {
  return static_cast<std::size_t>(block_tokens) * kTokenDataBytes +
         static_cast<std::size_t>(t) * kTokenScaleBytes;
}

// UE8M0 scale byte: scale = 2^(byte - 127).
inline constexpr int kScaleBias = 127;
inline constexpr float kFp8Max = 448.0f;   // e4m3 finite max
inline constexpr float kAmaxFloor = 1e-4f; // vLLM clamps amax >= 1e-4 before taking the exponent

// Default model facts (docs/ds4_model.md §1, V4-Flash); every kernel takes them as arguments.
inline constexpr int kDefaultWindow = 128;      // W
inline constexpr int kSwaBlockTokens = 64;      // SWA cache block (tokens)
inline constexpr int kCompressedBlockSpan = 256;// a compressed block covers 256 tokens: 256/r entries
// Query tokens per request in one decode step (s_q: 1 plain decode, 2 with one MTP draft token);
// the launchers accept 1 .. kMaxQueryTokens.
inline constexpr int kMaxQueryTokens = 16;

// A paged cache: num_blocks blocks of block_tokens tokens, `stride` bytes apart.
// A slot is block * block_tokens + offset_in_block (FlashMLA's global index convention).
struct PagedCache {
  std::uint8_t* base = nullptr;
  int block_tokens = kSwaBlockTokens;
  int num_blocks = 0;
  std::size_t stride = block_stride_bytes(kSwaBlockTokens);
};

}  // namespace graphsafe::ds4
