// ArenaResource (cuda::mr) and thrust_allocator over the host backend: the concept-generic interface
// (a function template constrained on cuda::mr::async_resource, and a type-erased
// cuda::mr::async_resource_ref) serves eager bytes from the arena's free list and, inside a capture,
// records opaque requests in the plan whose addresses every replay sees.
#include <graphsafe/cuda_mr.hpp>  // first: defines the CCCL experimental memory-resource macro

#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <cstdint>
#include <vector>

using namespace graphsafe;

namespace {

static_assert(cuda::mr::resource<ArenaResource>);
static_assert(cuda::mr::async_resource<ArenaResource>);
static_assert(cuda::mr::async_resource_with<ArenaResource, cuda::mr::device_accessible>);
static_assert(!cuda::mr::async_resource_with<ArenaResource, cuda::mr::host_accessible>);

// The host backend's streams travel through cuda::stream_ref as an opaque handle, exactly as a
// cudaStream_t does on the CUDA backend.
cuda::stream_ref ref_of(HostStream& s) { return cuda::stream_ref(Stream(s).cuda()); }

// Library code written against the concept only: allocates n int64 on `s`, launches a fill on the
// stream, returns the pointer.
template <class R>
  requires cuda::mr::async_resource<R>
std::int64_t* fill_iota(R& res, HostStream& hs, std::size_t n, std::int64_t base) {
  auto* p = static_cast<std::int64_t*>(res.allocate_async(n * sizeof(std::int64_t), 256, ref_of(hs)));
  hs.launch([=] {
    for (std::size_t i = 0; i < n; ++i) p[i] = base + static_cast<std::int64_t>(i);
  });
  return p;
}

template <class R>
  requires cuda::mr::async_resource<R>
void release(R& res, HostStream& hs, std::int64_t* p, std::size_t n) {
  res.deallocate_async(p, n * sizeof(std::int64_t), 256, ref_of(hs));
}

}  // namespace

TEST_CASE("cuda_mr: ArenaResource serves eager bytes through the async_resource concept", "[cuda_mr]") {
  HostBackend backend;
  Arena arena(backend);
  HostStream s;
  arena.reserve(1 << 20, s);
  ArenaResource res(arena, s);

  std::int64_t* p = fill_iota(res, s, 1000, 7);
  REQUIRE(p != nullptr);
  CHECK(reinterpret_cast<std::uintptr_t>(p) % 256 == 0);
  CHECK(p[0] == 7);
  CHECK(p[999] == 1006);
  CHECK(arena.stats().eager_blocks == 1);
  CHECK(arena.stats().eager_bytes >= 8000);
  release(res, s, p, 1000);
  CHECK(arena.stats().eager_blocks == 0);
  CHECK(arena.stats().eager_bytes == 0);

  // The synchronous entry points are stream-ordered on the bound stream.
  void* q = res.allocate(300);
  CHECK(arena.stats().eager_blocks == 1);
  res.deallocate(q, 300);
  CHECK(arena.stats().eager_blocks == 0);
  CHECK(arena.stats().free_bytes == arena.stats().slab_bytes);

  // Smaller alignments are served 256-aligned; larger than 256 is refused with a message.
  void* a = res.allocate_async(10, 16, ref_of(s));
  CHECK(reinterpret_cast<std::uintptr_t>(a) % 256 == 0);
  res.deallocate_async(a, 10, 16, ref_of(s));
  CHECK_THROWS_AS(res.allocate_async(10, 512, ref_of(s)), invalid_argument_error);
  CHECK_THROWS_AS(res.allocate(10, 3), invalid_argument_error);
  // Releasing what the arena did not serve (or twice) is an error that changes nothing.
  void* d = res.allocate(64);
  res.deallocate(d, 64);
  CHECK_THROWS_AS(res.deallocate(d, 64), invalid_argument_error);
  CHECK(arena.stats().eager_blocks == 0);
}

TEST_CASE("cuda_mr: async_resource_ref type-erases ArenaResource and compares equal only for the same arena", "[cuda_mr]") {
  HostBackend backend;
  Arena arena(backend), other(backend);
  HostStream s, s2;
  arena.reserve(1 << 20, s);
  ArenaResource res(arena, s), res_s2(arena, s2), res_other(other, s);

  cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref{res};
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref_s2{res_s2};
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref_other{res_other};
  CHECK(ref == ref_s2);  // same arena: either can release what the other served
  CHECK(ref != ref_other);
  CHECK(res == res_s2);
  CHECK(res != res_other);

  std::int64_t* p = fill_iota(ref, s, 64, 100);  // the ref satisfies the concept as well
  CHECK(p[63] == 163);
  CHECK(arena.stats().eager_blocks == 1);
  ref_s2.deallocate_async(p, 64 * sizeof(std::int64_t), 256, ref_of(s2));  // freed on another stream
  CHECK(arena.stats().eager_blocks == 0);

  // A non-async resource_ref can be made from the async one (what libraries that never pass a
  // stream take).
  cuda::mr::resource_ref<cuda::mr::device_accessible> sync_ref{ref};
  void* q = sync_ref.allocate(128, 256);
  CHECK(arena.stats().eager_blocks == 1);
  sync_ref.deallocate(q, 128, 256);
  CHECK(arena.stats().eager_blocks == 0);
}

TEST_CASE("cuda_mr: requests through the resource inside a capture land in the plan and stay put", "[cuda_mr]") {
  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s;
  arena.reserve(1 << 20, s);
  ArenaResource res(arena, s);
  cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref{res};
  thrust_allocator alloc(arena, s);

  std::vector<std::int64_t> out;
  std::int64_t* seen = nullptr;
  char* seen_thrust = nullptr;
  std::int64_t base = 5;
  Bindings b;
  auto graph = capture(arena, s, b, [&](const Bindings&) {
    std::int64_t* p = fill_iota(ref, s, 256, 0);
    seen = p;
    // Thrust-style temporary: allocate, use, release -- all inside the capture.
    char* t = alloc.allocate(1000);
    seen_thrust = t;
    s.launch([p, t, &base, &out] {
      for (int i = 0; i < 256; ++i) p[i] += base;
      t[999] = 1;
      out.assign(p, p + 256);
    });
    alloc.deallocate(t, 1000);     // no-op: owned by the graph
    release(ref, s, p, 256);       // no-op: owned by the graph
  });

  const Plan& plan = graph.plan();
  REQUIRE(plan.entries().size() == 2);
  CHECK(plan.entries()[0].kind == PlanEntry::Kind::opaque);
  CHECK(plan.entries()[0].bytes == 256 * sizeof(std::int64_t));
  CHECK(plan.entries()[1].kind == PlanEntry::Kind::opaque);
  CHECK(plan.entries()[1].bytes == 1000);
  CHECK(plan.guard_count() == 0);
  CHECK(graph.reserved_bytes() >= 256 * sizeof(std::int64_t) + 1000);
  const auto in_region = [&](const void* p) {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    const auto lo = reinterpret_cast<std::uintptr_t>(seen) - plan.entries()[0].offset;
    return a >= lo && a < lo + graph.reserved_bytes();
  };
  CHECK(in_region(seen_thrust));
  ArenaStats st = arena.stats();
  CHECK(st.live_graphs == 1);
  CHECK(st.region_bytes == graph.reserved_bytes());
  CHECK(st.eager_blocks == 0);  // nothing of the capture was served eagerly

  // Eager requests while the graph lives never land in its region.
  std::int64_t* e = fill_iota(res, s, 256, 1);
  CHECK(!in_region(e));
  CHECK(!in_region(e + 255));
  release(res, s, e, 256);

  for (std::int64_t k : {5, 6, 7}) {
    base = k;
    graph.replay(b, s);
    REQUIRE(out.size() == 256);
    // the fill was recorded too: each replay refills then adds
    CHECK(out[0] == k);
    CHECK(out[255] == 255 + k);
  }
  {
    auto dead = std::move(graph);
  }
  st = arena.stats();
  CHECK(st.live_graphs == 0);
  CHECK(st.region_bytes == 0);
  CHECK(st.free_bytes == st.slab_bytes);
}

TEST_CASE("cuda_mr: thrust_allocator serves bytes eagerly and compares per arena", "[cuda_mr]") {
  HostBackend backend;
  Arena arena(backend), other(backend);
  HostStream s;
  arena.reserve(1 << 20, s);
  thrust_allocator a(arena, s), b(arena, s), c(other, s);
  static_assert(std::is_same_v<thrust_allocator::value_type, char>);
  CHECK(a == b);
  CHECK(a != c);
  char* p = a.allocate(5000);
  char* q = a.allocate(1);
  CHECK(p != q);
  CHECK(reinterpret_cast<std::uintptr_t>(q) % 256 == 0);
  p[4999] = 'x';
  CHECK(arena.stats().eager_blocks == 2);
  b.deallocate(p, 5000);
  a.deallocate(q, 1);
  CHECK(arena.stats().eager_blocks == 0);
  CHECK(arena.stats().free_bytes == arena.stats().slab_bytes);
}
