// Reliability on a real GPU:
//
//   * concurrency: threads allocating eagerly on their own streams while another thread captures,
//     replays and destroys graphs -- global and thread-local capture modes -- and two captures on
//     two streams at once (thread-local: the other thread synchronizes its stream, which global mode
//     forbids while any capture is under way). Every workspace is filled with a pattern of its
//     owner by a kernel and verified by another kernel later in stream order; mismatches are
//     counted on the device. A shared or reused range without the right ordering shows up there.
//   * out of memory with the pool capped (CudaBackendOptions::pool_max_bytes): growth fails with
//     out_of_memory_error, the pool's used bytes stay equal to the arena's slabs (nothing leaks),
//     and the arena keeps serving eagerly and under capture.
//   * soak: 10^4 capture/replay/destroy cycles with device memory in use (cudaMemGetInfo) flat.
//     GRAPHSAFE_RELIABILITY_CYCLES shortens it (e.g. 200 under compute-sanitizer).
//
// Eager threads make no synchronizing CUDA call while a global-mode capture may be running (that
// would invalidate it, by CUDA's rules): they verify on the device and synchronize after the join.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <cuda_runtime_api.h>

#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "../support/gpu_test_support.hpp"

using namespace graphsafe;
using namespace graphsafe_test;

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

int env_int(const char* name, int dflt) {
  if (const char* v = std::getenv(name)) {
    const int n = std::atoi(v);
    if (n > 0) return n;
  }
  return dflt;
}

__global__ void fill_u32(std::uint32_t* p, std::int64_t n, std::uint32_t tag) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    p[i] = tag ^ static_cast<std::uint32_t>(i);
}
__global__ void verify_u32(const std::uint32_t* p, std::int64_t n, std::uint32_t tag, unsigned long long* errors) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    if (p[i] != (tag ^ static_cast<std::uint32_t>(i))) atomicAdd(errors, 1ull);
}

void launch_check() { GRAPHSAFE_CUDA(cudaGetLastError()); }

// A device counter of mismatches.
struct Counter {
  unsigned long long* d = nullptr;
  Counter() {
    GRAPHSAFE_CUDA(cudaMalloc(&d, sizeof *d));
    GRAPHSAFE_CUDA(cudaMemset(d, 0, sizeof *d));
    GRAPHSAFE_CUDA(cudaDeviceSynchronize());  // legacy-stream memset: unordered with the test's streams
  }
  ~Counter() { cudaFree(d); }
  unsigned long long read() const {
    unsigned long long h = 0;
    GRAPHSAFE_CUDA(cudaMemcpy(&h, d, sizeof h, cudaMemcpyDeviceToHost));
    return h;
  }
  Counter(const Counter&) = delete;
  Counter& operator=(const Counter&) = delete;
};

struct Failures {
  std::atomic<std::uint64_t> unexpected{0};
  std::atomic<bool> has_first{false};
  std::string first;
  void note(const std::string& w) {
    ++unexpected;
    bool f = false;
    if (has_first.compare_exchange_strong(f, true)) first = w;
  }
};

// Eager worker: request, fill, (later) verify, release -- all stream-ordered on its own stream.
void eager_worker(Arena& arena, cudaStream_t s, int id, const std::atomic<bool>& stop, int min_iterations,
                  unsigned long long* errors, Failures& f, std::atomic<std::uint64_t>& ops) {
  std::mt19937_64 rng(1234 + static_cast<unsigned>(id));
  struct Held {
    Workspace ws;
    std::uint32_t tag;
  };
  std::deque<Held> live;
  Bindings b;
  for (int it = 0; it < min_iterations || !stop.load(); ++it) {
    try {
      const std::int64_t count = 1 + static_cast<std::int64_t>(rng() % (256 * 1024));
      Workspace w = arena.request(s, "eager", Extent(count), 4, capacity_bound, b);
      const std::uint32_t tag = (static_cast<std::uint32_t>(id) << 24) ^ static_cast<std::uint32_t>(it * 2654435761u);
      fill_u32<<<64, 256, 0, s>>>(w.as<std::uint32_t>(), count, tag);
      launch_check();
      live.push_back({std::move(w), tag});
      if (live.size() > 6 || rng() % 2) {
        Held& h = live.front();
        verify_u32<<<64, 256, 0, s>>>(h.ws.as<std::uint32_t>(), h.ws.count(), h.tag, errors);
        launch_check();
        live.pop_front();  // released after the verify in stream order
      }
      ops.fetch_add(1, std::memory_order_relaxed);
    } catch (const std::exception& e) {
      f.note("eager " + std::to_string(id) + ": " + e.what());
      break;
    }
  }
  for (Held& h : live) verify_u32<<<64, 256, 0, s>>>(h.ws.as<std::uint32_t>(), h.ws.count(), h.tag, errors);
  live.clear();
}

struct CaptureCounts {
  std::uint64_t ok = 0, replays = 0, out_of_space = 0;
};

// Captures graphs (fill + verify of a captured workspace), replays each a few times, destroys them.
// Destruction synchronizes the stream: only call sites where no global-mode capture of another
// thread can be running may destroy (`destroy_now`).
CaptureCounts capture_worker(Arena& arena, cudaStream_t s, int id, int rounds, CaptureMode mode, unsigned long long* errors,
                             Failures& f, std::barrier<>* both_open) {
  CaptureCounts c;
  Symbol n = Symbol::dynamic("rel.cap.n" + std::to_string(id), 1 << 16);
  auto fam = arena.family("rel" + std::to_string(id));
  std::vector<CapturedGraph> graphs;
  int arrived = 0;
  auto arrive = [&] {
    if (both_open && arrived < 2) {
      ++arrived;
      both_open->arrive_and_wait();
    }
  };
  auto pad = [&] {
    while (both_open && arrived < 2) arrive();
    arrived = 0;
  };
  for (int r = 0; r < rounds; ++r) {
    Bindings b;
    b.set(n, 1 + r % (1 << 16));
    const std::uint32_t tag = 0xC0000000u ^ (static_cast<std::uint32_t>(id) << 20) ^ static_cast<std::uint32_t>(r);
    try {
      CaptureOptions o;
      o.family = fam;
      o.mode = mode;
      CaptureSession cs(arena, s, b, o);
      arrive();
      auto w = arena.request(s, "cap.ws", Extent(n), 4, capacity_bound, b);
      fill_u32<<<128, 256, 0, s>>>(w.as<std::uint32_t>(), w.count(), tag);
      verify_u32<<<128, 256, 0, s>>>(w.as<std::uint32_t>(), w.count(), tag, errors);
      launch_check();
      graphs.push_back(cs.finish());
      pad();
      ++c.ok;
    } catch (const out_of_memory_error&) {
      ++c.out_of_space;
      pad();
    } catch (const std::exception& e) {
      f.note("capture " + std::to_string(id) + ": " + e.what());
      pad();
      break;
    }
    try {
      for (int k = 0; k < 3 && !graphs.empty(); ++k) {
        Bindings rb;
        rb.set(n, 1 + static_cast<std::int64_t>((r * 7 + k) % (1 << 16)));
        graphs[static_cast<std::size_t>(k) % graphs.size()].replay(rb, s);
        ++c.replays;
      }
    } catch (const std::exception& e) {
      f.note(std::string("replay: ") + e.what());
    }
    if (graphs.size() > 4) graphs.erase(graphs.begin());  // destroyed: synchronizes s
  }
  graphs.clear();
  if (both_open) both_open->arrive_and_drop();
  return c;
}

}  // namespace

TEST_CASE("gpu reliability: eager threads on their own streams while another thread captures", "[gpu][concurrency]") {
  for (CaptureMode mode : {CaptureMode::global, CaptureMode::thread_local_mode}) {
    INFO("mode " << (mode == CaptureMode::global ? "global" : "thread_local"));
    CudaBackend backend;
    Arena arena(backend, ArenaOptions{.growth_bytes = 32 * kMiB, .report_findings = false});
    StreamHolder streams[4];
    arena.reserve(256 * kMiB, streams[3].s);
    GRAPHSAFE_CUDA(cudaStreamSynchronize(streams[3].s));
    Counter errors;
    Failures f;
    std::atomic<bool> stop{false};
    std::atomic<std::uint64_t> ops{0};
    std::vector<std::thread> eager;
    for (int t = 0; t < 3; ++t)
      eager.emplace_back(eager_worker, std::ref(arena), streams[t].s, t, std::cref(stop), 200, errors.d, std::ref(f),
                         std::ref(ops));
    // In global mode the capturing thread destroys graphs (a synchronize) only between captures,
    // and the eager threads never synchronize: legal under CUDA's rules.
    CaptureCounts c;
    // GRAPHSAFE_RELIABILITY_ROUNDS scales the capture rounds down under compute-sanitizer.
    const int rounds = env_int("GRAPHSAFE_RELIABILITY_ROUNDS", 200);
    std::thread capturer([&] { c = capture_worker(arena, streams[3].s, 50, rounds, mode, errors.d, f, nullptr); });
    capturer.join();
    stop = true;
    for (auto& t : eager) t.join();
    GRAPHSAFE_CUDA(cudaDeviceSynchronize());
    INFO(f.first);
    CHECK(f.unexpected == 0);
    CHECK(errors.read() == 0);
    CHECK(c.ok >= rounds - rounds / 20);  // a few rounds may find the region full (out_of_space)
    const ArenaStats st = arena.stats();
    CHECK(st.eager_blocks == 0);
    CHECK(st.live_graphs == 0);
    CHECK(st.free_bytes + st.eager_bytes + st.region_bytes == st.slab_bytes);
    std::printf("gpu concurrency (%s): %llu captures (%llu out of space), %llu replays, %llu eager ops, %llu slabs\n",
                mode == CaptureMode::global ? "global" : "thread_local", static_cast<unsigned long long>(c.ok),
                static_cast<unsigned long long>(c.out_of_space), static_cast<unsigned long long>(c.replays),
                static_cast<unsigned long long>(ops.load()), static_cast<unsigned long long>(st.slabs));
  }
}

TEST_CASE("gpu reliability: two captures on two streams at once (thread-local mode)", "[gpu][concurrency]") {
  CudaBackend backend;
  Arena arena(backend, ArenaOptions{.growth_bytes = 32 * kMiB, .report_findings = false});
  StreamHolder a, b, e;
  arena.reserve(128 * kMiB, a.s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(a.s));
  Counter errors;
  Failures f;
  std::barrier<> both_open(2);
  CaptureCounts ca, cb;
  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> ops{0};
  const int rounds = env_int("GRAPHSAFE_RELIABILITY_ROUNDS", 150);
  std::thread ta([&] { ca = capture_worker(arena, a.s, 60, rounds, CaptureMode::thread_local_mode, errors.d, f, &both_open); });
  std::thread tb([&] { cb = capture_worker(arena, b.s, 61, rounds, CaptureMode::thread_local_mode, errors.d, f, &both_open); });
  std::thread te(eager_worker, std::ref(arena), e.s, 62, std::cref(stop), 100, errors.d, std::ref(f), std::ref(ops));
  ta.join();
  tb.join();
  stop = true;
  te.join();
  GRAPHSAFE_CUDA(cudaDeviceSynchronize());
  INFO(f.first);
  CHECK(f.unexpected == 0);
  CHECK(errors.read() == 0);
  CHECK(ca.ok + cb.ok >= 2 * rounds - rounds / 15);
  CHECK(arena.stats().live_graphs == 0);
  CHECK(arena.stats().region_bytes == 0);
}

TEST_CASE("gpu reliability: capped pool, out of memory is clear, nothing leaks, the arena keeps serving", "[gpu][oom]") {
  const std::uint64_t cap = 64 * kMiB;
  CudaBackend backend(CudaBackendOptions{.pool_max_bytes = cap});
  Arena arena(backend, ArenaOptions{.growth_bytes = 16 * kMiB, .report_findings = false});
  StreamHolder sh;
  const cudaStream_t s = sh.s;
  auto pool_used = [&] {
    std::uint64_t v = 0;
    GRAPHSAFE_CUDA(cudaMemPoolGetAttribute(backend.pool(), cudaMemPoolAttrUsedMemCurrent, &v));
    return v;
  };
  Bindings b;
  std::vector<Workspace> held;
  std::string message;
  for (int i = 0; i < 16; ++i) {
    try {
      held.push_back(arena.request(s, "fill", Extent(std::int64_t{12} << 20), 1, capacity_bound, b));
      GRAPHSAFE_CUDA(cudaMemsetAsync(held.back().data(), i + 1, held.back().bytes(), s));
    } catch (const out_of_memory_error& e) {
      message = e.what();
      break;
    }
  }
  INFO(message);
  REQUIRE_FALSE(message.empty());
  CHECK(message.find("16777216") != std::string::npos);  // the slab size it asked for
  CHECK(message.find("raise the pool cap") != std::string::npos);
  CHECK(held.size() >= 3);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  const ArenaStats full = arena.stats();
  const std::uint64_t used = pool_used();
  CHECK(used == full.slab_bytes);
  std::size_t free0 = 0, total = 0;
  GRAPHSAFE_CUDA(cudaMemGetInfo(&free0, &total));
  for (int i = 0; i < 200; ++i) {
    CHECK_THROWS_AS(arena.request(s, "more", Extent(std::int64_t{32} << 20), 1, capacity_bound, b), out_of_memory_error);
    CHECK_THROWS_AS(arena.reserve(32 * kMiB, s), out_of_memory_error);
    CHECK_THROWS_AS(arena.allocate(s, 32 * kMiB), out_of_memory_error);
  }
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  std::size_t free1 = 0;
  GRAPHSAFE_CUDA(cudaMemGetInfo(&free1, &total));
  CHECK(pool_used() == used);  // nothing leaked in the pool
  CHECK(free1 + 2 * kMiB >= free0);
  CHECK(arena.stats().slab_bytes == full.slab_bytes);
  CHECK(arena.stats().eager_bytes == full.eager_bytes);
  // Still serving: eager requests in the slabs' tails, a capture and its replays.
  auto small = arena.request(s, "small", Extent(std::int64_t{1} << 20), 1, capacity_bound, b);
  Counter errors;
  auto g = capture(arena, s, b, [&](const Bindings& bb) {
    auto w = arena.request(s, "cap", Extent(std::int64_t{1} << 18), 4, capacity_bound, bb);
    fill_u32<<<64, 256, 0, s>>>(w.as<std::uint32_t>(), w.count(), 77u);
    verify_u32<<<64, 256, 0, s>>>(w.as<std::uint32_t>(), w.count(), 77u, errors.d);
    launch_check();
  });
  for (int i = 0; i < 10; ++i) g.replay(b, s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  CHECK(errors.read() == 0);
  // Release and trim: the pool gets the slabs back, and the arena grows again.
  small.reset();
  held.clear();
  arena.trim(s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  CHECK(pool_used() == arena.stats().slab_bytes);
  auto again = arena.request(s, "again", Extent(std::int64_t{32} << 20), 1, capacity_bound, b);
  CHECK(again.bytes() == 32 * kMiB);
  again.reset();
  { CapturedGraph gone(std::move(g)); }
  arena.trim(s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  CHECK(arena.stats().slabs == 0);
  CHECK(pool_used() == 0);
}

TEST_CASE("gpu reliability: 10^4 capture/replay/destroy cycles, device memory flat", "[gpu][soak]") {
  const int cycles = env_int("GRAPHSAFE_RELIABILITY_CYCLES", 10000);
  CudaBackend backend;
  Arena arena(backend, ArenaOptions{.growth_bytes = 16 * kMiB, .report_findings = false});
  StreamHolder sh, other;
  const cudaStream_t s = sh.s;
  Symbol n = Symbol::dynamic("rel.soak.n", 1 << 18);
  Symbol B = Symbol::fixed("rel.soak.B");
  auto fam = arena.family("soak");
  Counter errors;
  arena.reserve(64 * kMiB, s);
  auto cycle = [&](int i) {
    Bindings b;
    b.set(B, 1 + i % 4).set(n, 1 + (i * 7919) % (1 << 18));
    CaptureOptions o;
    if (i % 2) o.family = fam;  // half share one family's region, half get their own
    auto g = capture(arena, s, b, [&](const Bindings& bb) {
      auto w = arena.request(s, "kv", Extent(n) * Extent(B), 4, capacity_bound, bb);
      void* tmp = arena.allocate(s, 4096 + static_cast<std::uint64_t>(i % 7) * 1000);
      (void)tmp;
      const std::uint32_t tag = static_cast<std::uint32_t>(i);
      fill_u32<<<128, 256, 0, s>>>(w.as<std::uint32_t>(), w.count(), tag);
      verify_u32<<<128, 256, 0, s>>>(w.as<std::uint32_t>(), w.count(), tag, errors.d);
      launch_check();
    }, o);
    g.replay(b, s);
    g.replay(b, i % 3 ? s : other.s);  // a replay on another stream is ordered after the last one
    // Eager traffic between graphs.
    auto e = arena.request(s, "eager", Extent(std::int64_t{1} << 16), 4, capacity_bound, b);
    fill_u32<<<32, 256, 0, s>>>(e.as<std::uint32_t>(), e.count(), 5u);
  };  // graph destroyed
  for (int i = 0; i < 20; ++i) cycle(i);  // warm-up: slabs and the pool reach their steady state
  GRAPHSAFE_CUDA(cudaDeviceSynchronize());
  std::size_t free0 = 0, total = 0;
  GRAPHSAFE_CUDA(cudaMemGetInfo(&free0, &total));
  const ArenaStats st0 = arena.stats();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < cycles; ++i) cycle(i);
  GRAPHSAFE_CUDA(cudaDeviceSynchronize());
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::size_t free1 = 0;
  GRAPHSAFE_CUDA(cudaMemGetInfo(&free1, &total));
  const ArenaStats st1 = arena.stats();
  const long long delta = static_cast<long long>(free0) - static_cast<long long>(free1);
  std::printf("gpu soak: %d capture/replay/destroy cycles in %.2f s (%.0f cycles/s); device free before %zu, "
              "after %zu (in use grew by %lld bytes); arena slabs %llu -> %llu (%llu -> %llu bytes)\n",
              cycles, secs, cycles / secs, free0, free1, delta, static_cast<unsigned long long>(st0.slabs),
              static_cast<unsigned long long>(st1.slabs), static_cast<unsigned long long>(st0.slab_bytes),
              static_cast<unsigned long long>(st1.slab_bytes));
  CHECK(errors.read() == 0);
  CHECK(delta <= static_cast<long long>(4 * kMiB));  // flat (a leaked 256 KiB per cycle would be GiBs)
  CHECK(st1.slab_bytes == st0.slab_bytes);
  CHECK(st1.live_graphs == 0);
  CHECK(st1.region_bytes == 0);
  CHECK(st1.eager_blocks == 0);
  CHECK(st1.free_bytes == st1.slab_bytes);
}
