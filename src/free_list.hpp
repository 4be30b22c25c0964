// Best-fit free list with coalescing over address ranges (no CUDA here: tested on the CPU).
//
// Blocks are intrusive nodes (Boost.Intrusive), so serving and returning a block allocates nothing:
// descriptors come from a pool that grows only when a slab is added. Each slab keeps its blocks in
// address order (a list) for O(1) coalescing; free blocks sit in a tree ordered by (size, address)
// for best fit; used blocks sit in a tree keyed by address so a raw pointer can be returned.
//
// Lazy coalescing: an eager release (release_eager) parks the block in a small cache keyed by its
// exact size instead of coalescing it, and the next request of that size on the same stream takes
// it back without touching the trees (the steady state of a serving loop: the same few sizes every
// step). Cached blocks are neither free nor used: they leave the cache -- and coalesce as if they
// had just been given back -- when a request finds no free block that fits, before the largest
// block is taken, before streams are marked ready or slabs trimmed, and on flush_cache(). So a
// cache never makes the arena grow or a capture fail; it only delays coalescing.
#pragma once

#include <boost/intrusive/list.hpp>
#include <boost/intrusive/set.hpp>

#include <cstdint>
#include <deque>
#include <list>
#include <string>
#include <vector>

namespace graphsafe::detail {

namespace bi = boost::intrusive;

struct Slab;

enum class BlockState : std::uint8_t { free, used, region, held, cached };

struct Block {
  bi::set_member_hook<bi::link_mode<bi::normal_link>> tree_hook;  // free tree or used tree
  bi::list_member_hook<bi::link_mode<bi::normal_link>> slab_hook; // address order within the slab
  std::uintptr_t addr = 0;
  std::uint64_t size = 0;
  Slab* slab = nullptr;
  BlockState state = BlockState::free;
  bool indexed = false;    // in the used tree (raw allocate); stays there while cached
  void* stream = nullptr;  // stream of the last release (free blocks); nullptr = ready for any stream
  std::uint64_t released = 0;  // FreeList::releases() at that release (the latest of merged blocks)
  Block* next_spare = nullptr;  // descriptor pool link, or the next block of a cache bin
};

struct BySizeThenAddr {
  bool operator()(const Block& a, const Block& b) const {
    return a.size != b.size ? a.size < b.size : a.addr < b.addr;
  }
};
struct ByAddr {
  bool operator()(const Block& a, const Block& b) const { return a.addr < b.addr; }
};

using SlabList = bi::list<Block, bi::member_hook<Block, decltype(Block::slab_hook), &Block::slab_hook>,
                          bi::constant_time_size<true>>;
using FreeTree = bi::multiset<Block, bi::member_hook<Block, decltype(Block::tree_hook), &Block::tree_hook>,
                              bi::compare<BySizeThenAddr>, bi::constant_time_size<true>>;
using UsedTree = bi::set<Block, bi::member_hook<Block, decltype(Block::tree_hook), &Block::tree_hook>,
                         bi::compare<ByAddr>, bi::constant_time_size<true>>;

struct Slab {
  std::uintptr_t addr = 0;
  std::uint64_t size = 0;
  SlabList blocks;
};

class FreeList {
 public:
  FreeList() = default;
  FreeList(const FreeList&) = delete;
  FreeList& operator=(const FreeList&) = delete;
  ~FreeList();

  // `stream`: the stream the slab was allocated on (its memory is ready in that stream's order).
  void add_slab(std::uintptr_t addr, std::uint64_t size, void* stream = nullptr);
  // Best fit: smallest free block >= bytes (lowest address among equals), split to `bytes`.
  // Returns nullptr when nothing fits, even after flushing the cache. The block comes back in
  // state `used` (not indexed).
  Block* take_best_fit(std::uint64_t bytes);
  // A cached block of exactly `bytes` last released on `stream` (state `used`, in the used tree
  // iff `index`), or nullptr. Never needs stream ordering: the block was released on the stream
  // that takes it.
  Block* take_cached(std::uint64_t bytes, void* stream, bool index) {
    if (cached_blocks_ == 0) return nullptr;
    for (std::size_t i = bin_of(bytes);; i = (i + 1) & (kCacheSlots - 1)) {
      CacheBin& bin = bins_[i];
      if (bin.size == 0) return nullptr;
      if (bin.size != bytes) continue;
      for (Block** link = &bin.head; *link; link = &(*link)->next_spare) {
        Block* b = *link;
        if (b->stream != stream) continue;
        *link = b->next_spare;
        b->next_spare = nullptr;
        b->state = BlockState::used;
        --cached_blocks_;
        cached_bytes_ -= b->size;
        if (b->indexed != index) index ? index_used(b) : unindex_used(b);
        return b;
      }
      return nullptr;
    }
  }
  // An eager release: park a used block in the cache (an indexed block stays in the used tree, so
  // a raw allocate of its size re-takes it without touching either tree), or give it back
  // (coalescing) when the cache is full.
  void release_eager(Block* b, void* stream);
  // Give every cached block back (coalescing). Cheap when the cache is empty.
  void flush_cache() {
    if (cached_blocks_) flush_cache_slow();
  }
  // The largest free block, whole (flushes the cache first); nullptr when none.
  Block* take_largest();
  // Take this specific free block out of the free tree (it becomes `held`).
  void take(Block* free_block);
  // Shrink a taken block to `keep` bytes; the tail goes back to the free tree (coalescing).
  void trim_tail(Block* b, std::uint64_t keep);
  // Merge the free block right after `b` (in the same slab) into `b`, taking `extra` bytes of it
  // (the rest stays free). Returns false if the next block is not free or too small.
  bool extend(Block* b, std::uint64_t extra);
  // Return a block: it becomes free, released on `stream`, and coalesces with free neighbours
  // released on the same stream (or on none).
  void give_back(Block* b, void* stream);
  Block* next_in_slab(Block* b) const;

  void index_used(Block* b) {
    used_.insert(*b);
    b->indexed = true;
  }
  void unindex_used(Block* b) {
    used_.erase(used_.iterator_to(*b));
    b->indexed = false;
  }
  // The indexed block at `addr` if it is in use; nullptr otherwise (a cached one was released).
  Block* find_used(std::uintptr_t addr);

  // Forget the release streams in `synchronized_streams` (the caller waited for them) of the blocks
  // released up to `horizon` (releases() when the caller chose the streams: a block released later
  // may still be in use by work its stream queued after the wait) and coalesce what that frees up
  // (the cache is flushed first).
  void mark_ready(const std::vector<void*>& synchronized_streams, std::uint64_t horizon = ~std::uint64_t{0});
  // Releases counted so far (give_back, release_eager, add_slab): orders releases against waits.
  std::uint64_t releases() const { return releases_; }
  // Slabs whose single block is free and ready (no release stream: see mark_ready), after flushing
  // the cache; removes them and returns (addr, size) pairs.
  std::vector<std::pair<std::uintptr_t, std::uint64_t>> remove_free_slabs();

  // Free-tree figures; cached blocks are not in them (flush_cache() first for the coalesced view).
  std::uint64_t free_bytes() const { return free_bytes_; }
  std::uint64_t cached_bytes() const { return cached_bytes_; }
  std::size_t cached_blocks() const { return cached_blocks_; }
  std::uint64_t largest_free() const { return free_.empty() ? 0 : free_.rbegin()->size; }
  std::uint64_t slab_bytes() const { return slab_bytes_; }
  std::size_t slabs() const { return slabs_.size(); }
  std::size_t free_blocks() const { return free_.size(); }
  // Internal consistency: free tree sorted by (size, address) and holding exactly the free blocks,
  // free_bytes() equal to their sum; the cache holding exactly the cached blocks, each in the bin of
  // its size. Returns an empty string when consistent (tests call it).
  std::string validate() const;
  // Visit every block of every slab in address order (tests check invariants with this).
  template <class F>
  void for_each_block(F&& f) const {
    for (const Slab& s : slabs_)
      for (const Block& b : s.blocks) f(s, b);
  }

 private:
  Block* new_block();
  void delete_block(Block* b);
  void insert_free(Block* b);
  void erase_free(Block* b);
  void flush_cache_slow();
  // give_back keeping b->released (a cached block's release, a taken block's tail).
  void put_back(Block* b, void* stream);

  // The cache: open addressing over exact sizes (a bin stays claimed until the next flush), each bin
  // a singly linked list (through next_spare) of blocks of that size.
  struct CacheBin {
    std::uint64_t size = 0;  // 0: unclaimed
    Block* head = nullptr;
  };
  static constexpr std::size_t kCacheSlots = 256;        // power of two
  static constexpr std::size_t kMaxCacheSizes = 128;     // claimed bins (half the slots)
  static constexpr std::size_t kMaxCachedBlocks = 256;
  static std::size_t bin_of(std::uint64_t bytes) {
    return static_cast<std::size_t>((bytes >> 8) * 0x9E3779B97F4A7C15ull >> 56) & (kCacheSlots - 1);
  }

  std::list<Slab> slabs_;
  FreeTree free_;
  UsedTree used_;
  std::deque<Block> storage_;  // descriptors never move
  Block* spare_ = nullptr;
  std::uint64_t free_bytes_ = 0;
  std::uint64_t releases_ = 0;
  std::uint64_t slab_bytes_ = 0;
  CacheBin bins_[kCacheSlots];
  std::size_t cache_sizes_ = 0;  // claimed bins
  std::size_t cached_blocks_ = 0;
  std::uint64_t cached_bytes_ = 0;
};

}  // namespace graphsafe::detail
