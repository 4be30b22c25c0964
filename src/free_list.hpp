// Best-fit free list with coalescing over address ranges (no CUDA here: tested on the CPU).
//
// Blocks are intrusive nodes (Boost.Intrusive), so serving and returning a block allocates nothing:
// descriptors come from a pool that grows only when a slab is added. Each slab keeps its blocks in
// address order (a list) for O(1) coalescing; free blocks sit in a tree ordered by (size, address)
// for best fit; used blocks sit in a tree keyed by address so a raw pointer can be returned.
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

enum class BlockState : std::uint8_t { free, used, region, held };

struct Block {
  bi::set_member_hook<bi::link_mode<bi::normal_link>> tree_hook;  // free tree or used tree
  bi::list_member_hook<bi::link_mode<bi::normal_link>> slab_hook; // address order within the slab
  std::uintptr_t addr = 0;
  std::uint64_t size = 0;
  Slab* slab = nullptr;
  BlockState state = BlockState::free;
  void* stream = nullptr;  // stream of the last release (free blocks); nullptr = ready for any stream
  Block* next_spare = nullptr;  // descriptor pool link
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
  // Returns nullptr when nothing fits. The block comes back in state `used` (not indexed).
  Block* take_best_fit(std::uint64_t bytes);
  // The largest free block, whole; nullptr when none.
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

  void index_used(Block* b) { used_.insert(*b); }
  void unindex_used(Block* b) { used_.erase(used_.iterator_to(*b)); }
  Block* find_used(std::uintptr_t addr);

  // Forget the release streams in `synchronized_streams` (the caller waited for them) and coalesce
  // what that frees up.
  void mark_ready(const std::vector<void*>& synchronized_streams);
  // Slabs whose single block is free; removes them and returns (addr, size) pairs.
  std::vector<std::pair<std::uintptr_t, std::uint64_t>> remove_free_slabs();

  std::uint64_t free_bytes() const { return free_bytes_; }
  std::uint64_t largest_free() const { return free_.empty() ? 0 : free_.rbegin()->size; }
  std::uint64_t slab_bytes() const { return slab_bytes_; }
  std::size_t slabs() const { return slabs_.size(); }
  std::size_t free_blocks() const { return free_.size(); }
  // Internal consistency: free tree sorted by (size, address) and holding exactly the free blocks,
  // free_bytes() equal to their sum. Returns an empty string when consistent (tests call it).
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

  std::list<Slab> slabs_;
  FreeTree free_;
  UsedTree used_;
  std::deque<Block> storage_;  // descriptors never move
  Block* spare_ = nullptr;
  std::uint64_t free_bytes_ = 0;
  std::uint64_t slab_bytes_ = 0;
};

}  // namespace graphsafe::detail
