// Checks on an arena's state shared by the arena tests. Include after <catch2/catch.hpp> and
// <graphsafe/graphsafe.hpp>.
#pragma once

#include <graphsafe/arena.hpp>

namespace graphsafe_test {

// The arena holds the slabs it held at `before` and nothing in them: no workspace, region, family,
// graph or capture (after failed captures, after every graph is destroyed). `before` was taken
// with nothing live either.
inline void check_back_to_slabs(const graphsafe::ArenaStats& before, const graphsafe::ArenaStats& now) {
  CHECK(now.slab_bytes == before.slab_bytes);
  CHECK(now.slabs == before.slabs);
  CHECK(now.free_bytes == now.slab_bytes);
  CHECK(now.largest_free == before.largest_free);
  CHECK(now.eager_bytes == 0);
  CHECK(now.eager_blocks == 0);
  CHECK(now.region_bytes == 0);
  CHECK(now.families == 0);
  CHECK(now.live_graphs == 0);
  CHECK(now.active_captures == 0);
}

}  // namespace graphsafe_test
