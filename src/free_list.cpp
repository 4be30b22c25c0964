#include "free_list.hpp"

#include <algorithm>

#include <cassert>

namespace graphsafe::detail {

FreeList::~FreeList() {
  free_.clear();
  used_.clear();
  for (Slab& s : slabs_) s.blocks.clear();
}

Block* FreeList::new_block() {
  if (!spare_) {
    // Grow the descriptor pool in batches; this is the only allocation and happens when a slab
    // is added or the block count reaches a new high-water mark, never in steady state.
    for (int i = 0; i < 64; ++i) {
      storage_.emplace_back();
      storage_.back().next_spare = spare_;
      spare_ = &storage_.back();
    }
  }
  Block* b = spare_;
  spare_ = b->next_spare;
  b->next_spare = nullptr;
  b->state = BlockState::free;
  b->indexed = false;
  b->stream = nullptr;
  b->released = 0;
  return b;
}

void FreeList::delete_block(Block* b) {
  b->next_spare = spare_;
  spare_ = b;
}

void FreeList::insert_free(Block* b) {
  b->state = BlockState::free;
  free_.insert(*b);
  free_bytes_ += b->size;
}

void FreeList::erase_free(Block* b) {
  free_.erase(free_.iterator_to(*b));
  free_bytes_ -= b->size;
}

void FreeList::add_slab(std::uintptr_t addr, std::uint64_t size, void* stream) {
  slabs_.emplace_back();
  Slab& s = slabs_.back();
  s.addr = addr;
  s.size = size;
  Block* b = new_block();
  b->addr = addr;
  b->size = size;
  b->slab = &s;
  b->stream = stream;
  b->released = ++releases_;
  s.blocks.push_back(*b);
  insert_free(b);
  slab_bytes_ += size;
  // Keep spare descriptors for the splits this slab will see before the next slab arrives.
  if (!spare_) delete_block(new_block());
}

Block* FreeList::take_best_fit(std::uint64_t bytes) {
  Block key;
  key.size = bytes;
  key.addr = 0;
  auto it = free_.lower_bound(key);
  if (it == free_.end()) {
    // Cached blocks may coalesce into a range that fits: never fail (or grow) because of the cache.
    if (!cached_blocks_) return nullptr;
    flush_cache_slow();
    it = free_.lower_bound(key);
    if (it == free_.end()) return nullptr;
  }
  Block* b = &*it;
  if (b->size == bytes) {
    erase_free(b);
    b->state = BlockState::used;
    return b;
  }
  // Split: the front becomes a new used block, the free node keeps the tail. A shrinking node
  // keeps its place in the (size, address) order unless its predecessor is now larger, so the
  // common case (carving from a large free block) touches the tree not at all.
  Block* front = new_block();
  front->addr = b->addr;
  front->size = bytes;
  front->slab = b->slab;
  front->stream = b->stream;
  front->released = b->released;
  front->state = BlockState::used;
  b->slab->blocks.insert(b->slab->blocks.iterator_to(*b), *front);
  b->addr += bytes;
  b->size -= bytes;
  free_bytes_ -= bytes;
  if (it != free_.begin() && BySizeThenAddr{}(*b, *std::prev(it))) {
    free_.erase(it);
    free_.insert(*b);
  }
  return front;
}

Block* FreeList::take_largest() {
  flush_cache();
  if (free_.empty()) return nullptr;
  Block* b = &*free_.rbegin();
  erase_free(b);
  b->state = BlockState::held;
  return b;
}

void FreeList::take(Block* b) {
  assert(b->state == BlockState::free);
  erase_free(b);
  b->state = BlockState::held;
}

void FreeList::trim_tail(Block* b, std::uint64_t keep) {
  if (keep >= b->size) return;
  Block* tail = new_block();
  tail->addr = b->addr + keep;
  tail->size = b->size - keep;
  tail->slab = b->slab;
  tail->stream = b->stream;
  tail->released = b->released;
  b->size = keep;
  b->slab->blocks.insert(std::next(b->slab->blocks.iterator_to(*b)), *tail);
  tail->state = BlockState::used;  // put_back marks it free and coalesces it with the next block
  put_back(tail, tail->stream);
}

Block* FreeList::next_in_slab(Block* b) const {
  auto it = std::next(b->slab->blocks.iterator_to(*b));
  return it == b->slab->blocks.end() ? nullptr : &*it;
}

bool FreeList::extend(Block* b, std::uint64_t extra) {
  if (extra == 0) return true;
  Block* n = next_in_slab(b);
  if (!n || n->state != BlockState::free || n->size < extra) return false;
  erase_free(n);
  if (n->size == extra) {
    b->slab->blocks.erase(b->slab->blocks.iterator_to(*n));
    delete_block(n);
  } else {
    n->addr += extra;
    n->size -= extra;
    insert_free(n);
  }
  b->size += extra;
  return true;
}

void FreeList::give_back(Block* b, void* stream) {
  b->released = ++releases_;
  put_back(b, stream);
}

void FreeList::put_back(Block* b, void* stream) {
  b->stream = stream;
  auto& list = b->slab->blocks;
  auto mergeable = [&](Block* n) {
    return n && n->state == BlockState::free && (n->stream == nullptr || stream == nullptr || n->stream == stream);
  };
  auto it = list.iterator_to(*b);
  Block* p = it != list.begin() ? &*std::prev(it) : nullptr;
  Block* n = next_in_slab(b);
  if (!mergeable(p)) p = nullptr;
  if (!mergeable(n)) n = nullptr;
  // A ready block between blocks released on two different streams joins only one of them: a
  // block carries one tag, and the other stream's bytes would lose their ordering.
  if (p && n && p->stream && n->stream && p->stream != n->stream) n = nullptr;
  if (!p && !n) {
    insert_free(b);
    return;
  }
  // Grow one free neighbour in place (the larger: it is nearest its final place in the size
  // order) and absorb the rest; re-insert it only if it now sorts after its successor.
  Block* keep = (p && n) ? (p->size >= n->size ? p : n) : (p ? p : n);
  Block* other = (p && n) ? (keep == p ? n : p) : nullptr;
  std::uintptr_t addr = p ? p->addr : b->addr;
  std::uint64_t size = b->size + (p ? p->size : 0) + (n ? n->size : 0);
  void* merged_stream = keep->stream ? keep->stream : (other && other->stream ? other->stream : b->stream);
  const std::uint64_t merged_released = std::max({keep->released, other ? other->released : 0, b->released});
  if (other) {
    erase_free(other);
    list.erase(list.iterator_to(*other));
    delete_block(other);
  }
  list.erase(list.iterator_to(*b));
  delete_block(b);
  auto kit = free_.iterator_to(*keep);
  free_bytes_ += size - keep->size;
  keep->addr = addr;
  keep->size = size;
  keep->stream = merged_stream;
  keep->released = merged_released;
  auto next = std::next(kit);
  if (next != free_.end() && BySizeThenAddr{}(*next, *keep)) {
    free_.erase(kit);
    free_.insert(*keep);
  } else if (kit != free_.begin() && BySizeThenAddr{}(*keep, *std::prev(kit))) {
    free_.erase(kit);  // address moved down among equal sizes
    free_.insert(*keep);
  }
}

void FreeList::release_eager(Block* b, void* stream) {
  assert(b->state == BlockState::used);
  // At most half of the slab bytes wait in the cache, so most of the arena stays coalesced.
  if (cached_blocks_ < kMaxCachedBlocks && cached_bytes_ + b->size <= slab_bytes_ / 2) {
    std::size_t i = bin_of(b->size);
    while (bins_[i].size != 0 && bins_[i].size != b->size) i = (i + 1) & (kCacheSlots - 1);
    if (bins_[i].size == 0) {
      if (cache_sizes_ >= kMaxCacheSizes) {
        // A new size and every bin claimed: the working set moved on. Coalesce what is cached and
        // start over (amortized: at most once per kMaxCacheSizes new sizes).
        flush_cache_slow();
        i = bin_of(b->size);
      }
      bins_[i].size = b->size;
      ++cache_sizes_;
    }
    b->stream = stream;
    b->released = ++releases_;
    b->state = BlockState::cached;
    b->next_spare = bins_[i].head;
    bins_[i].head = b;
    ++cached_blocks_;
    cached_bytes_ += b->size;
    return;
  }
  if (b->indexed) unindex_used(b);
  give_back(b, stream);
}

void FreeList::flush_cache_slow() {
  for (CacheBin& bin : bins_) {
    while (Block* b = bin.head) {
      bin.head = b->next_spare;
      b->next_spare = nullptr;
      b->state = BlockState::used;
      if (b->indexed) unindex_used(b);
      put_back(b, b->stream);  // released when it was cached
    }
    bin.size = 0;
  }
  cache_sizes_ = 0;
  cached_blocks_ = 0;
  cached_bytes_ = 0;
}

Block* FreeList::find_used(std::uintptr_t addr) {
  Block key;
  key.addr = addr;
  auto it = used_.find(key);
  return it == used_.end() || it->state != BlockState::used ? nullptr : &*it;
}

void FreeList::mark_ready(const std::vector<void*>& synchronized_streams, std::uint64_t horizon) {
  flush_cache();
  auto synced = [&](void* st) {
    return !st || std::find(synchronized_streams.begin(), synchronized_streams.end(), st) != synchronized_streams.end();
  };
  for (Slab& s : slabs_) {
    for (Block& b : s.blocks)
      if (b.state == BlockState::free && b.released <= horizon && synced(b.stream)) b.stream = nullptr;
    // Coalesce runs of free blocks (a block still tied to a stream merges only with ready ones or
    // its own stream's, as in give_back).
    for (auto it = s.blocks.begin(); it != s.blocks.end(); ++it) {
      Block* b = &*it;
      if (b->state != BlockState::free) continue;
      Block* n;
      while ((n = next_in_slab(b)) && n->state == BlockState::free &&
             (!n->stream || !b->stream || n->stream == b->stream)) {
        erase_free(b);
        erase_free(n);
        b->size += n->size;
        if (!b->stream) b->stream = n->stream;
        b->released = std::max(b->released, n->released);
        s.blocks.erase(s.blocks.iterator_to(*n));
        delete_block(n);
        insert_free(b);
      }
    }
  }
}

std::vector<std::pair<std::uintptr_t, std::uint64_t>> FreeList::remove_free_slabs() {
  flush_cache();
  std::vector<std::pair<std::uintptr_t, std::uint64_t>> out;
  out.reserve(slabs_.size());  // nothing below throws once a slab is unlinked
  for (auto it = slabs_.begin(); it != slabs_.end();) {
    // Only ready slabs: one still tagged with a stream (one that is capturing, so could not be
    // waited for) may be in use by that stream's earlier work.
    if (it->blocks.size() == 1 && it->blocks.front().state == BlockState::free && !it->blocks.front().stream) {
      Block* b = &it->blocks.front();
      erase_free(b);
      it->blocks.clear();
      delete_block(b);
      out.emplace_back(it->addr, it->size);
      slab_bytes_ -= it->size;
      it = slabs_.erase(it);
    } else {
      ++it;
    }
  }
  return out;
}

std::string FreeList::validate() const {
  std::uint64_t sum = 0, count = 0;
  const Block* prev = nullptr;
  for (const Block& b : free_) {
    if (b.state != BlockState::free) return "free tree holds a block that is not free at " + std::to_string(b.addr);
    if (prev && BySizeThenAddr{}(b, *prev)) return "free tree out of order at " + std::to_string(b.addr);
    prev = &b;
    sum += b.size;
    ++count;
  }
  std::uint64_t listed = 0, listed_cached = 0, listed_indexed = 0;
  for (const Slab& s : slabs_)
    for (const Block& b : s.blocks) {
      listed += b.state == BlockState::free;
      listed_cached += b.state == BlockState::cached;
      listed_indexed += b.indexed;
    }
  for (const Block& b : used_)
    if (!b.indexed || (b.state != BlockState::used && b.state != BlockState::cached))
      return "used tree holds a block that is neither used nor cached at " + std::to_string(b.addr);
  if (listed_indexed != used_.size())
    return "used tree has " + std::to_string(used_.size()) + " blocks, slabs list " + std::to_string(listed_indexed) +
           " indexed ones";
  if (listed != count) return "free tree has " + std::to_string(count) + " blocks, slabs list " + std::to_string(listed);
  if (sum != free_bytes_) return "free bytes " + std::to_string(free_bytes_) + " != sum " + std::to_string(sum);
  std::uint64_t cached = 0, cached_sum = 0, sizes = 0;
  for (std::size_t i = 0; i < kCacheSlots; ++i) {
    const CacheBin& bin = bins_[i];
    if (bin.size == 0) {
      if (bin.head) return "unclaimed cache bin holds blocks";
      continue;
    }
    ++sizes;
    // Open addressing: every slot from the size's home to here is claimed (bins are never unclaimed
    // one by one).
    for (std::size_t j = bin_of(bin.size); j != i; j = (j + 1) & (kCacheSlots - 1))
      if (bins_[j].size == 0 || bins_[j].size == bin.size) return "cache bin of size " + std::to_string(bin.size) + " misplaced";
    for (const Block* b = bin.head; b; b = b->next_spare) {
      if (b->state != BlockState::cached || b->size != bin.size)
        return "cache bin of size " + std::to_string(bin.size) + " holds a block of " + std::to_string(b->size) +
               " that is not cached at " + std::to_string(b->addr);
      ++cached;
      cached_sum += b->size;
    }
  }
  if (sizes != cache_sizes_) return "cache claims " + std::to_string(cache_sizes_) + " sizes, bins hold " + std::to_string(sizes);
  if (cached != cached_blocks_ || listed_cached != cached)
    return "cache counts " + std::to_string(cached_blocks_) + " blocks, bins hold " + std::to_string(cached) +
           ", slabs list " + std::to_string(listed_cached);
  if (cached_sum != cached_bytes_) return "cached bytes " + std::to_string(cached_bytes_) + " != sum " + std::to_string(cached_sum);
  return {};
}

}  // namespace graphsafe::detail
