// Debug mode on a real GPU: capture findings, probe of kernel arguments (cudaGraphKernelNodeGetParams
// + cudaFuncGetParamInfo), canaries checked after replays, concurrent family replays, audit_replay on
// the seed's regression, NVTX registration compiled in (compute-sanitizer: examples/nvtx_overflow_demo),
// eager workspaces released while a graph's kernels or copies still use them.
#include <catch2/catch.hpp>

#include <graphsafe/debug.hpp>
#include <graphsafe/graphsafe.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "../support/gpu_test_support.hpp"
#include "../support/seed_kernels.cuh"

using namespace graphsafe;
using namespace graphsafe_test;
using namespace graphsafe_test::seed;

namespace {

// The seed's decode step through the arena: two dimensions, the workspace, three kernels.
struct Step {
  Arena& arena;
  cudaStream_t s;
  const Model& m;
  const SizingPolicy& compressed;
  const SizingPolicy& swa;
  const int* d_lens;
  std::int64_t* d_out;
  void operator()(const Bindings& b) const {
    const std::int64_t N = arena.dimension(s, "kv.compressed_rows", m.n_c, compressed, b);
    const std::int64_t G = arena.dimension(s, "kv.swa_rows", m.g, swa, b);
    const std::int64_t M = N + G;
    auto ws = arena.request(s, "kv", Extent(m.R) * M, sizeof(std::int64_t), capacity_bound, b);
    launch_seed_step(s, ws.as<std::int64_t>(), ws.count(), N, M, d_lens, static_cast<int>(b.value(m.R)), d_out);
  }
};

ArenaOptions debug_options() {
  ArenaOptions o;
  o.debug = true;
  return o;
}

std::vector<debug::Finding> of_kind(const std::vector<debug::Finding>& fs, std::string_view kind) {
  std::vector<debug::Finding> out;
  for (const auto& f : fs)
    if (f.kind == kind) out.push_back(f);
  return out;
}

}  // namespace

// External linkage, never inlined: the release site a finding names (the test links with -rdynamic).
__attribute__((noinline)) void release_metadata(Workspace& w) {
  w.reset();
  asm volatile("" ::: "memory");  // not a tail call: this frame stays on the stack
}

TEST_CASE("gpu debug: capture findings for unbounded sizes and opaque requests", "[gpu][debug]") {
  debug::clear_findings();
  StreamHolder sh;
  // cudaMalloc'd slabs: the NVTX heap/region registration runs (compute-sanitizer rejects NVTX heaps
  // on stream-ordered pool memory, so over the pool graphsafe registers nothing).
  CudaBackendOptions bo;
  bo.plain_allocations = true;
  CudaBackend backend(bo);
  CHECK(backend.nvtx_heaps_supported());
  Arena arena(backend, debug_options());
  CHECK(arena.options().nvtx);  // NVTX registration compiled in and on for the CUDA backend
  arena.reserve(16 << 20, sh.s);
  Model m;
  DevBuf<int> d_lens(2);
  DevBuf<std::int64_t> d_out(2 * kOutW);
  d_lens.upload({3, 5}, sh.s);
  auto graph = capture(arena, sh.s, m.bind({3, 5}), [&](const Bindings& bb) {
    Step{arena, sh.s, m, exact_at_capture, exact_at_capture, d_lens.p, d_out.p}(bb);
    void* tmp = arena.allocate(sh.s, 1000);
    arena.deallocate(sh.s, tmp, 1000);
  });
  const auto fs = debug::findings();
  REQUIRE(of_kind(fs, debug::kind::unbounded_dynamic_size).size() == 2);
  CHECK_THAT(of_kind(fs, debug::kind::unbounded_dynamic_size)[0].message, Catch::Contains("seq_lens = [3, 5]"));
  REQUIRE(of_kind(fs, debug::kind::opaque_request_in_capture).size() == 1);
  CHECK_THAT(of_kind(fs, debug::kind::opaque_request_in_capture)[0].site, Catch::Contains("test_debug_gpu.cu"));
  graph.replay(m.bind({3, 5}), sh.s);
  GRAPHSAFE_CUDA(cudaStreamSynchronize(sh.s));
  CHECK(debug::check_canaries(graph, sh.s).empty());
}

TEST_CASE("gpu debug: probe reports differing kernel arguments and nothing for the safe twin", "[gpu][debug][probe]") {
  debug::clear_findings();
  StreamHolder sh;
  CudaBackend backend;
  Arena arena(backend, debug_options());
  arena.reserve(16 << 20, sh.s);
  Model m;
  DevBuf<int> d_lens(2);
  DevBuf<std::int64_t> d_out(2 * kOutW);
  d_lens.upload({3, 5}, sh.s);
  const Bindings a = m.bind({3, 5}), b = m.bind({15, 17});
  const auto diffs = debug::probe(arena, sh.s, Step{arena, sh.s, m, exact_at_capture, exact_at_capture, d_lens.p, d_out.p},
                                  a, b);
  for (const auto& f : diffs) INFO(f.request << ": " << f.message);
  auto count_if = [&](auto pred) { return std::count_if(diffs.begin(), diffs.end(), pred); };
  CHECK(count_if([](const debug::Finding& f) { return f.request == "kv.compressed_rows"; }) == 1);
  CHECK(count_if([](const debug::Finding& f) { return f.request == "kv"; }) == 1);
  // gather_kernel(ws, N, M, lens): N (argument 1) and M (argument 2) are frozen at capture.
  CHECK(count_if([](const debug::Finding& f) {
          return f.request.find("gather_kernel") != std::string::npos &&
                 f.message.find("argument 1 (8 bytes at offset 8) differs: 0x0000000000000001 vs 0x0000000000000004") !=
                     std::string::npos;
        }) == 1);
  CHECK(count_if([](const debug::Finding& f) {
          return f.request.find("gather_kernel") != std::string::npos && f.message.find("argument 2") != std::string::npos;
        }) == 1);
  CHECK(count_if([](const debug::Finding& f) {
          return f.request.find("gather_kernel") != std::string::npos && f.message.find("argument 0") != std::string::npos;
        }) == 0);  // the workspace pointer: same offset in one family, same address
  CHECK(count_if([](const debug::Finding& f) { return f.request.find("attend_kernel") != std::string::npos; }) == 2);

  const StaticQueryBound swa(Extent(m.W));
  const auto none = debug::probe(arena, sh.s, Step{arena, sh.s, m, capacity_bound, swa, d_lens.p, d_out.p}, a, b);
  for (const auto& f : none) INFO(f.request << ": " << f.message);
  CHECK(none.empty());
  GRAPHSAFE_CUDA(cudaStreamSynchronize(sh.s));
  CHECK(arena.stats().live_graphs == 0);
}

TEST_CASE("gpu debug: the canary behind 'kv' catches the seed's overflow and names the replay", "[gpu][debug][canary]") {
  StreamHolder sh;
  CudaBackend backend;
  Model m;
  DevBuf<int> d_lens(2);
  DevBuf<std::int64_t> d_out(2 * kOutW);
  for (std::uint32_t every : {1u, 0u}) {
    debug::clear_findings();
    ArenaOptions o = debug_options();
    o.canary_check_every = every;
    Arena arena(backend, o);
    arena.reserve(16 << 20, sh.s);
    CaptureOptions co;
    co.family = arena.family("seed");
    d_lens.upload({3, 5}, sh.s);
    auto graph = capture(arena, sh.s, m.bind({3, 5}),
                         Step{arena, sh.s, m, exact_at_capture, exact_at_capture, d_lens.p, d_out.p}, co);
    graph.replay(m.bind({3, 5}), sh.s);
    CHECK(debug::check_canaries(graph, sh.s).empty());
    d_lens.upload({15, 17}, sh.s);
    graph.replay_unguarded_for_testing(sh.s);  // replay #2: overlap inside kv, nothing past it
    CHECK(debug::check_canaries(graph, sh.s).empty());
    d_lens.upload({255, 257}, sh.s);
    graph.replay_unguarded_for_testing(sh.s);  // replay #3: writes past kv
    const auto found = debug::check_canaries(graph, sh.s);
    REQUIRE(found.size() == 1);
    CHECK(found[0].request == "kv");
    CHECK_THAT(found[0].graph, Catch::Contains("family 'seed'"));
    CHECK_THAT(found[0].message, Catch::Contains("replay #3"));
    CHECK(of_kind(debug::findings(), debug::kind::canary_overwrite).size() == 1);
    d_lens.upload({3, 5}, sh.s);
    graph.replay(m.bind({3, 5}), sh.s);  // re-armed: clean again
    CHECK(debug::check_canaries(graph, sh.s).empty());
    GRAPHSAFE_CUDA(cudaStreamSynchronize(sh.s));
  }
}

TEST_CASE("gpu debug: one family replayed on two streams is reported", "[gpu][debug][family]") {
  debug::clear_findings();
  StreamHolder s1, s2;
  CudaBackend backend;
  Arena arena(backend, debug_options());
  arena.reserve(16 << 20, s1.s);
  Symbol n = Symbol::dynamic("tokens", 1 << 16);
  CaptureOptions o;
  o.family = arena.family("decode");
  auto fn = [&](const Bindings& bb) {
    auto ws = arena.request(s1.s, "x", Extent(n), sizeof(std::int64_t), capacity_bound, bb);
    fill_kernel<<<4, kThreads, 0, s1.s>>>(ws.as<std::int64_t>(), ws.count(), 7);
    GRAPHSAFE_CUDA(cudaGetLastError());
  };
  auto g1 = capture(arena, s1.s, Bindings().set(n, 8), fn, o);
  auto g2 = capture(arena, s1.s, Bindings().set(n, 16), fn, o);
  g1.replay(Bindings().set(n, 8), s1.s);
  g2.replay(Bindings().set(n, 16), s1.s);
  CHECK(of_kind(debug::findings(), debug::kind::concurrent_family_replay).empty());
  g1.replay(Bindings().set(n, 8), s2.s);
  const auto c = of_kind(debug::findings(), debug::kind::concurrent_family_replay);
  REQUIRE(c.size() == 1);
  CHECK_THAT(c[0].graph, Catch::Contains("family 'decode'"));
  CHECK_THAT(c[0].site, Catch::Contains("test_debug_gpu.cu"));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s2.s));
  CHECK(of_kind(debug::findings(), debug::kind::canary_overwrite).empty());
}

TEST_CASE("gpu debug: audit_replay flags the exact-at-capture graph and passes the safe one", "[gpu][debug][audit]") {
  debug::clear_findings();
  StreamHolder sh;
  CudaBackend backend;
  Arena arena(backend, debug_options());
  arena.reserve(16 << 20, sh.s);
  Model m;
  DevBuf<int> d_lens(2);
  DevBuf<std::int64_t> d_out(2 * kOutW);
  const std::vector<Bindings> later = {m.bind({3, 5}), m.bind({15, 17}), m.bind({255, 257}), m.bind({511, 512})};
  debug::AuditOptions ao;
  ao.prepare = [&](const Bindings& b) {
    const auto v = b.values(m.L);
    d_lens.upload(std::vector<int>(v.begin(), v.end()), sh.s);
  };
  auto output = [&] { return std::as_bytes(std::span<const std::int64_t>(d_out.p, d_out.n)); };
  const StaticQueryBound swa(Extent(m.W));
  const auto safe = debug::audit_replay(arena, sh.s, Step{arena, sh.s, m, capacity_bound, swa, d_lens.p, d_out.p},
                                        output, m.bind({3, 5}), later, ao);
  REQUIRE(safe.size() == later.size());
  for (const auto& st : safe) {
    INFO(st.message);
    CHECK(st.equal);
  }
  const auto guarded = debug::audit_replay(
      arena, sh.s, Step{arena, sh.s, m, exact_at_capture, exact_at_capture, d_lens.p, d_out.p}, output, m.bind({3, 5}),
      later, ao);
  CHECK(guarded[0].equal);
  CHECK(guarded[1].refused);
  ao.bypass_guards = true;
  const auto bypassed = debug::audit_replay(
      arena, sh.s, Step{arena, sh.s, m, exact_at_capture, exact_at_capture, d_lens.p, d_out.p}, output, m.bind({3, 5}),
      later, ao);
  CHECK(bypassed[0].equal);
  CHECK_FALSE(bypassed[1].equal);  // the seed's corruption, found byte for byte
  CHECK_FALSE(of_kind(debug::findings(), debug::kind::replay_mismatch).empty());
  GRAPHSAFE_CUDA(cudaStreamSynchronize(sh.s));
}

// The engine pattern: metadata requested eagerly once, its address captured as a kernel argument and
// as a copy's source, then released while the graph lives: its bytes are served again and every
// replay writes into their new owner.
// Findings cleared, a debug-mode arena with 16 MiB reserved, and a device buffer copies go to.
struct EagerCaptureFixture {
  EagerCaptureFixture() {
    debug::clear_findings();
    arena.reserve(16 << 20, sh.s);
  }
  StreamHolder sh;
  CudaBackend backend;
  Arena arena{backend, debug_options()};
  DevBuf<std::int64_t> copied{1024};
};

TEST_CASE_METHOD(EagerCaptureFixture,
                 "gpu debug: an eager workspace released while a captured kernel or copy uses it is reported",
                 "[gpu][debug][captured-eager]") {
  auto meta = arena.request(sh.s, "decode.metadata", Extent(1024), sizeof(std::int64_t), capacity_bound, Bindings{});
  // Initialized eagerly, as an engine fills its metadata before capturing (initcheck does not count
  // the graph's kernel node as initializing what its memcpy node then reads).
  GRAPHSAFE_CUDA(cudaMemsetAsync(meta.data(), 0, meta.bytes(), sh.s));
  auto graph = capture(arena, sh.s, Bindings{}, [&](const Bindings&) {
    fill_kernel<<<4, kThreads, 0, sh.s>>>(meta.as<std::int64_t>(), meta.count(), 7);
    GRAPHSAFE_CUDA(cudaGetLastError());
    GRAPHSAFE_CUDA(cudaMemcpyAsync(copied.p, meta.data(), meta.bytes(), cudaMemcpyDeviceToDevice, sh.s));
  });
  graph.replay(Bindings{}, sh.s);
  // Reference: the replay wrote the eager workspace and copied it out (the graph does use it).
  std::vector<std::int64_t> host(copied.n);
  GRAPHSAFE_CUDA(cudaMemcpyAsync(host.data(), copied.p, copied.bytes(), cudaMemcpyDeviceToHost, sh.s));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(sh.s));
  CHECK(std::all_of(host.begin(), host.end(), [](std::int64_t v) { return v == 7; }));
  CHECK(of_kind(debug::findings(), debug::kind::captured_eager_release).empty());

  release_metadata(meta);
  auto f = of_kind(debug::findings(), debug::kind::captured_eager_release);
  REQUIRE(f.size() == 1);  // one finding per graph, naming the first node found using it
  INFO(f[0].message << " | site: " << f[0].site);
  CHECK(f[0].request == "decode.metadata");
  CHECK_THAT(f[0].graph, Catch::Contains("graph #"));
  CHECK_THAT(f[0].message, Catch::Contains("(8192 bytes at 0x"));
  CHECK_THAT(f[0].message, Catch::Contains("requested at test_debug_gpu.cu:"));
  const bool kernel = f[0].message.find("argument 0 of node #") != std::string::npos &&
                      f[0].message.find("fill_kernel") != std::string::npos;
  const bool copy = f[0].message.find("the source of node #") != std::string::npos;
  CHECK((kernel || copy));
  CHECK_THAT(f[0].site, Catch::Contains("release_metadata"));

  // A graph that only copies from an eager workspace: the memcpy node is what holds it.
  debug::clear_findings();
  auto src = arena.request(sh.s, "decode.positions", Extent(512), sizeof(std::int64_t), capacity_bound, Bindings{});
  auto copy_graph = capture(arena, sh.s, Bindings{}, [&](const Bindings&) {
    GRAPHSAFE_CUDA(cudaMemcpyAsync(copied.p, src.data(), src.bytes(), cudaMemcpyDeviceToDevice, sh.s));
  });
  release_metadata(src);
  f = of_kind(debug::findings(), debug::kind::captured_eager_release);
  REQUIRE(f.size() == 1);
  CHECK(f[0].request == "decode.positions");
  CHECK_THAT(f[0].message, Catch::Contains("the source of node #") && Catch::Contains("(memcpy)"));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(sh.s));
}

TEST_CASE_METHOD(EagerCaptureFixture,
                 "gpu debug: an eager workspace released inside the capture whose kernel uses it is reported",
                 "[gpu][debug][captured-eager]") {
  auto meta = arena.request(sh.s, "decode.metadata", Extent(1024), sizeof(std::int64_t), capacity_bound, Bindings{});
  auto graph = capture(arena, sh.s, Bindings{}, [&](const Bindings&) {
    fill_kernel<<<4, kThreads, 0, sh.s>>>(meta.as<std::int64_t>(), meta.count(), 7);
    GRAPHSAFE_CUDA(cudaGetLastError());
    release_metadata(meta);  // "resized" inside the capture: the kernel node keeps the old address
  });
  const auto f = of_kind(debug::findings(), debug::kind::captured_eager_release);
  REQUIRE(f.size() == 1);
  INFO(f[0].message << " | site: " << f[0].site);
  CHECK(f[0].request == "decode.metadata");
  CHECK_THAT(f[0].message, Catch::Contains("was released during the capture of"));
  CHECK_THAT(f[0].message, Catch::Contains("argument 0 of node #") && Catch::Contains("fill_kernel"));
  CHECK_THAT(f[0].site, Catch::Contains("release_metadata"));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(sh.s));
}

TEST_CASE_METHOD(EagerCaptureFixture,
                 "gpu debug: no captured-eager finding for a workspace requested inside the capture or a graph "
                 "destroyed first",
                 "[gpu][debug][captured-eager]") {
  {
    // The fix: the workspace requested inside the capture belongs to the graph.
    auto graph = capture(arena, sh.s, Bindings{}, [&](const Bindings& b) {
      auto meta = arena.request(sh.s, "decode.metadata", Extent(1024), sizeof(std::int64_t), capacity_bound, b);
      // A memset node first: initcheck does not count the graph's kernel node as initializing what
      // its memcpy node then reads, and the region's bytes are otherwise uninitialized.
      GRAPHSAFE_CUDA(cudaMemsetAsync(meta.data(), 0, meta.bytes(), sh.s));
      fill_kernel<<<4, kThreads, 0, sh.s>>>(meta.as<std::int64_t>(), meta.count(), 7);
      GRAPHSAFE_CUDA(cudaGetLastError());
      GRAPHSAFE_CUDA(cudaMemcpyAsync(copied.p, meta.data(), meta.bytes(), cudaMemcpyDeviceToDevice, sh.s));
    });
    graph.replay(Bindings{}, sh.s);
    // Reference: the replay filled the graph's own workspace and copied it out.
    std::vector<std::int64_t> host(copied.n);
    GRAPHSAFE_CUDA(cudaMemcpyAsync(host.data(), copied.p, copied.bytes(), cudaMemcpyDeviceToHost, sh.s));
    GRAPHSAFE_CUDA(cudaStreamSynchronize(sh.s));
    CHECK(std::all_of(host.begin(), host.end(), [](std::int64_t v) { return v == 7; }));
  }
  auto meta = arena.request(sh.s, "decode.metadata", Extent(1024), sizeof(std::int64_t), capacity_bound, Bindings{});
  {
    // Eager, captured, but the graph is destroyed before the workspace is released.
    auto graph = capture(arena, sh.s, Bindings{}, [&](const Bindings&) {
      fill_kernel<<<4, kThreads, 0, sh.s>>>(meta.as<std::int64_t>(), meta.count(), 7);
      GRAPHSAFE_CUDA(cudaGetLastError());
    });
    graph.replay(Bindings{}, sh.s);
    GRAPHSAFE_CUDA(cudaStreamSynchronize(sh.s));
  }
  release_metadata(meta);
  CHECK(of_kind(debug::findings(), debug::kind::captured_eager_release).empty());
  GRAPHSAFE_CUDA(cudaStreamSynchronize(sh.s));
}
