// One DS4 attention layer's static configuration and the index widths that follow from it:
//
//   graphsafe::ds4::LayerConfig c4{.ratio = 4};          // C4, V4-Flash defaults
//   int rows = c4.combined_width();                       // 640: 512 picks + 128 SWA rows
//
// Header-only: the client, the kernels and the CPU reference share it without linking each other.
#pragma once

#include <graphsafe/ds4/layout.hpp>

namespace graphsafe::ds4 {

// One layer type. ratio: 1 = C1 (SWA only), 4 = C4 (overlapping gated pooling + indexer top-k),
// 128 = C128 (all compressed rows).
struct LayerConfig {
  int ratio = 4;
  int window = kDefaultWindow;          // W
  int topk = 512;                       // K: C4 indexer picks (ignored for C1/C128)
  int heads = 64;                       // H (padded heads: 64 or 128 on GPU; any on CPU)
  int max_model_len = 65536;            // capacity of seq_len
  int swa_block_tokens = kSwaBlockTokens;
  // compressed cache block: 256 tokens -> 256/ratio entries (C4: 64, C128: 2)
  int compressed_block_entries() const { return ratio > 1 ? kCompressedBlockSpan / ratio : 0; }
  // capacity of visible compressed rows: ceil(max_model_len / r), 0 for C1
  int compressed_capacity() const { return ratio > 1 ? (max_model_len + ratio - 1) / ratio : 0; }
  // static width of the compressed part of a combined index row: C4 K, C128 round_up(cap,128), C1 0
  int compressed_width() const {
    if (ratio == 4) return topk;
    if (ratio > 1) return static_cast<int>(round_up_128(compressed_capacity()));
    return 0;
  }
  // combined index row width: round_up(compressed_width + W, 128)
  int combined_width() const {
    return static_cast<int>(round_up_128(static_cast<long long>(compressed_width()) + window));
  }

 private:
  static long long round_up_128(long long a) { return (a + 127) / 128 * 128; }
};

}  // namespace graphsafe::ds4
