// The arena's free list on its own (src/free_list.hpp): best fit, splitting, coalescing only with
// neighbours released on the same stream, the exact-size cache, stream readiness and slab removal.
// Expected layouts are worked out by hand from the addresses below, not read back from the list.
#include "free_list.hpp"

#include <catch2/catch.hpp>

#include <cstdint>
#include <utility>
#include <vector>

using graphsafe::detail::Block;
using graphsafe::detail::BlockState;
using graphsafe::detail::FreeList;

namespace {

constexpr std::uintptr_t kBase = 0x100000;
void* const kStreamA = reinterpret_cast<void*>(0xA0);
void* const kStreamB = reinterpret_cast<void*>(0xB0);

// (addr offset from kBase, size, state) of every block, in address order.
struct Seen {
  std::uintptr_t off;
  std::uint64_t size;
  BlockState state;
  bool operator==(const Seen&) const = default;
};
std::vector<Seen> layout(const FreeList& fl) {
  std::vector<Seen> out;
  fl.for_each_block([&](const auto&, const Block& b) { out.push_back({b.addr - kBase, b.size, b.state}); });
  return out;
}

}  // namespace

TEST_CASE("free list: best fit takes the smallest block that fits, lowest address first", "[free_list]") {
  FreeList fl;
  fl.add_slab(kBase, 4096);
  Block* a = fl.take_best_fit(1024);  // [0, 1024)
  Block* b = fl.take_best_fit(512);   // [1024, 1536)
  Block* c = fl.take_best_fit(1024);  // [1536, 2560)
  Block* d = fl.take_best_fit(256);   // [2560, 2816), rest [2816, 4096) free
  REQUIRE((a && b && c && d));
  CHECK(a->addr == kBase);
  CHECK(b->addr == kBase + 1024);
  CHECK(d->addr == kBase + 2560);
  fl.give_back(a, nullptr);  // free: [0,1024) 1024, [2816,4096) 1280
  fl.give_back(c, nullptr);  // free: [1536,2560) 1024 too
  // 1000 bytes: two 1024-byte holes; the lower address wins, and it is split.
  Block* e = fl.take_best_fit(1000);
  REQUIRE(e);
  CHECK(e->addr == kBase);
  CHECK(e->size == 1000);
  // 1100 bytes fits only the 1280-byte tail.
  Block* f = fl.take_best_fit(1100);
  REQUIRE(f);
  CHECK(f->addr == kBase + 2816);
  // Nothing of 2000 bytes is left.
  CHECK(fl.take_best_fit(2000) == nullptr);
  CHECK(fl.validate().empty());
}

TEST_CASE("free list: freed neighbours coalesce back into the whole slab", "[free_list]") {
  FreeList fl;
  fl.add_slab(kBase, 3000);
  Block* a = fl.take_best_fit(1000);
  Block* b = fl.take_best_fit(1000);
  Block* c = fl.take_best_fit(1000);
  REQUIRE((a && b && c));
  CHECK(fl.free_blocks() == 0);
  fl.give_back(a, nullptr);
  fl.give_back(c, nullptr);
  CHECK(layout(fl) == std::vector<Seen>{{0, 1000, BlockState::free}, {1000, 1000, BlockState::used},
                                        {2000, 1000, BlockState::free}});
  fl.give_back(b, nullptr);  // the middle joins both sides
  CHECK(layout(fl) == std::vector<Seen>{{0, 3000, BlockState::free}});
  CHECK(fl.free_bytes() == 3000);
  CHECK(fl.largest_free() == 3000);
  CHECK(fl.validate().empty());
}

TEST_CASE("free list: blocks released on different streams stay apart until their streams are waited for",
          "[free_list][streams]") {
  FreeList fl;
  fl.add_slab(kBase, 3000);
  Block* a = fl.take_best_fit(1000);
  Block* b = fl.take_best_fit(1000);
  Block* c = fl.take_best_fit(1000);
  fl.give_back(a, kStreamA);
  fl.give_back(b, kStreamB);
  fl.give_back(c, kStreamA);
  // Merging would give one tag to bytes another stream may still use: three blocks remain.
  CHECK(layout(fl) == std::vector<Seen>{{0, 1000, BlockState::free}, {1000, 1000, BlockState::free},
                                        {2000, 1000, BlockState::free}});
  // Stream B waited for: the middle needs no ordering any more, so it joins its neighbours, and the
  // merged block keeps the tag of the stream its other bytes still wait on.
  fl.mark_ready({kStreamB});
  CHECK(layout(fl) == std::vector<Seen>{{0, 3000, BlockState::free}});
  void* tag = nullptr;
  fl.for_each_block([&](const auto&, const Block& b) { tag = b.stream; });
  CHECK(tag == kStreamA);
  CHECK(fl.remove_free_slabs().empty());  // not ready: A's work may still use it
  fl.mark_ready({kStreamA});
  fl.for_each_block([&](const auto&, const Block& b) { tag = b.stream; });
  CHECK(tag == nullptr);
  CHECK(fl.validate().empty());
}

TEST_CASE("free list: a block released after the caller chose the streams to wait for keeps its stream",
          "[free_list][streams]") {
  FreeList fl;
  fl.add_slab(kBase, 2000);
  Block* a = fl.take_best_fit(1000);
  Block* b = fl.take_best_fit(1000);
  fl.give_back(a, kStreamA);
  const std::uint64_t horizon = fl.releases();  // the caller waits for A from here
  fl.release_eager(b, kStreamA);                // A queued more work on b after that wait
  CHECK(fl.releases() > horizon);
  fl.mark_ready({kStreamA}, horizon);
  // b (coalesced with a) may still be in use by A: the merged block keeps A's tag, the slab stays.
  CHECK(layout(fl) == std::vector<Seen>{{0, 2000, BlockState::free}});
  void* tag = nullptr;
  fl.for_each_block([&](const auto&, const Block& blk) { tag = blk.stream; });
  CHECK(tag == kStreamA);
  CHECK(fl.remove_free_slabs().empty());
  fl.mark_ready({kStreamA}, fl.releases());  // waited for again, after b's release
  fl.for_each_block([&](const auto&, const Block& blk) { tag = blk.stream; });
  CHECK(tag == nullptr);
  CHECK(fl.remove_free_slabs().size() == 1);
  CHECK(fl.validate().empty());
}

TEST_CASE("free list: a ready block between two streams' blocks joins only one of them", "[free_list][streams]") {
  FreeList fl;
  fl.add_slab(kBase, 3000);
  Block* a = fl.take_best_fit(1000);
  Block* b = fl.take_best_fit(1000);
  Block* c = fl.take_best_fit(1000);
  fl.give_back(a, kStreamA);
  fl.give_back(c, kStreamB);
  fl.give_back(b, nullptr);  // needs no ordering itself
  // One block tagged A over all three would let a request wait on A only while B's work may still
  // use the last 1000 bytes.
  std::vector<std::pair<std::uint64_t, void*>> blocks;
  fl.for_each_block([&](const auto&, const Block& x) { blocks.emplace_back(x.size, x.stream); });
  CHECK(blocks == std::vector<std::pair<std::uint64_t, void*>>{{2000, kStreamA}, {1000, kStreamB}});
  CHECK(fl.validate().empty());
}

TEST_CASE("free list: the exact-size cache serves the same stream and coalesces when flushed",
          "[free_list][cache]") {
  FreeList fl;
  fl.add_slab(kBase, 2048);
  Block* a = fl.take_best_fit(512);
  Block* b = fl.take_best_fit(512);
  fl.release_eager(a, kStreamA);
  CHECK(fl.cached_blocks() == 1);
  CHECK(fl.cached_bytes() == 512);
  CHECK(a->state == BlockState::cached);
  CHECK(fl.take_cached(512, kStreamB, false) == nullptr);  // another stream: no ordering, no reuse
  CHECK(fl.take_cached(256, kStreamA, false) == nullptr);  // another size
  Block* again = fl.take_cached(512, kStreamA, false);
  CHECK(again == a);
  CHECK(a->state == BlockState::used);
  fl.release_eager(a, nullptr);
  fl.give_back(b, nullptr);
  fl.flush_cache();  // the cached block coalesces as if just given back
  CHECK(fl.cached_blocks() == 0);
  CHECK(layout(fl) == std::vector<Seen>{{0, 2048, BlockState::free}});
  CHECK(fl.validate().empty());
}

TEST_CASE("free list: only whole, ready slabs are removed", "[free_list][trim]") {
  FreeList fl;
  fl.add_slab(kBase, 1024);
  fl.add_slab(kBase + 4096, 1024);
  fl.add_slab(kBase + 8192, 1024);
  Block* used = fl.take_best_fit(1024);  // lowest address: the first slab
  REQUIRE(used);
  CHECK(used->addr == kBase);
  Block* tagged = fl.take_best_fit(1024);  // the second slab, released on a stream not waited for
  fl.give_back(tagged, kStreamA);
  const auto removed = fl.remove_free_slabs();
  CHECK(removed == std::vector<std::pair<std::uintptr_t, std::uint64_t>>{{kBase + 8192, 1024}});
  CHECK(fl.slabs() == 2);
  fl.mark_ready({kStreamA});
  CHECK(fl.remove_free_slabs() == std::vector<std::pair<std::uintptr_t, std::uint64_t>>{{kBase + 4096, 1024}});
  CHECK(fl.slabs() == 1);
  fl.give_back(used, nullptr);
  CHECK(fl.validate().empty());
}
