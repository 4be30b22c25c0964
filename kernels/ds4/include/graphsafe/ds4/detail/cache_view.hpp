// Internal: byte addresses of a token's data and scales in a paged fp8_ds_mla cache, the arithmetic
// every DS4 kernel uses to turn a slot into addresses (layout.hpp is the layout; this is its fast
// evaluation). Host + device, so the CPU tests check it against layout.hpp (test_ds4_reference)
// for every block size, power of two or not. Not part of the API.
#pragma once

#include <graphsafe/ds4/layout.hpp>

#include <cstdint>

#if defined(__CUDACC__)
#define GRAPHSAFE_DS4_HD __host__ __device__ __forceinline__
#else
#define GRAPHSAFE_DS4_HD inline
#endif

namespace graphsafe::ds4::cuda::detail {

// slots = num_blocks * block_tokens and shift = log2(block_tokens) (-1 if not a power of two) are
// precomputed on the host (view_of): a 32-bit division by a runtime value is ~20 instructions, and
// every DS4 block size (64 SWA tokens, 64 / 2 compressed entries) is a power of two. (On the H200
// the attention producer's per-row division measured no different from the shift: the
// producer is no longer the tile loop's limit.)
struct CacheView {
  const std::uint8_t* base;
  int block_tokens;
  int num_blocks;
  unsigned long long stride;
  int slots;
  int shift;
  GRAPHSAFE_DS4_HD bool valid(long long slot) const { return slot >= 0 && slot < slots; }
  // Slots are < num_blocks * block_tokens < 2^31 (checked by require_cache): 32-bit div/mod.
  GRAPHSAFE_DS4_HD void split(long long slot, unsigned& blk, unsigned& off) const {
    const unsigned s = static_cast<unsigned>(slot), bt = static_cast<unsigned>(block_tokens);
    if (shift >= 0) {
      blk = s >> shift;
      off = s & (bt - 1u);
    } else {
      blk = s / bt;
      off = s - blk * bt;
    }
  }
  GRAPHSAFE_DS4_HD const std::uint8_t* data(long long slot) const {
    unsigned blk, off;
    split(slot, blk, off);
    return base + static_cast<unsigned long long>(blk) * stride + off * static_cast<unsigned>(kTokenDataBytes);
  }
  // Both addresses of a valid slot from one split (the attention producer's per-row path).
  GRAPHSAFE_DS4_HD void locate(long long slot, const std::uint8_t*& d, const std::uint8_t*& sc) const {
    unsigned blk, off;
    split(slot, blk, off);
    const std::uint8_t* blk_base = base + static_cast<unsigned long long>(blk) * stride;
    d = blk_base + off * static_cast<unsigned>(kTokenDataBytes);
    sc = blk_base + static_cast<unsigned>(block_tokens) * static_cast<unsigned>(kTokenDataBytes) +
         off * static_cast<unsigned>(kTokenScaleBytes);
  }
  GRAPHSAFE_DS4_HD const std::uint8_t* scales(long long slot) const {
    const std::uint8_t *d, *sc;
    locate(slot, d, sc);
    return sc;
  }
};

// The view of a cache that passed require_cache (block_tokens >= 1, num_blocks * block_tokens < 2^31).
inline CacheView view_of(const PagedCache& c) {
  int shift = -1;
  if (c.block_tokens > 0 && (c.block_tokens & (c.block_tokens - 1)) == 0) {
    shift = 0;
    while ((1 << shift) < c.block_tokens) ++shift;
  }
  return {c.base, c.block_tokens, c.num_blocks, static_cast<unsigned long long>(c.stride),
          static_cast<int>(static_cast<long long>(c.num_blocks) * c.block_tokens), shift};
}

}  // namespace graphsafe::ds4::cuda::detail

#undef GRAPHSAFE_DS4_HD
