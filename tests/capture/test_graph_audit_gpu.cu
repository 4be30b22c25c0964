// Debug mode's graph audit on real CUDA graphs: the nodes and edges come from cudaGraphGetNodes /
// cudaGraphGetEdges, the positions from cudaStreamGetCaptureInfo. A reuse forced across a stream the
// graph never joined (a backend that claims every release is ordered) is an unordered-reuse finding
// naming both request sites; the twin that joins the streams after the release reuses the same
// range, replays clean and has no finding.
#include <catch2/catch.hpp>

#include <graphsafe/graphsafe.hpp>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "../support/forced_reuse_backend.hpp"
#include "../support/gpu_test_support.hpp"
#include "../support/gpu_fill_check.cuh"

using namespace graphsafe;
using graphsafe_test::check;
using graphsafe_test::DevBuf;
using graphsafe_test::EventHolder;
using graphsafe_test::fill;
using graphsafe_test::fill_kernel;
using graphsafe_test::join;
using graphsafe_test::ForcedReuseBackend;
using graphsafe_test::StreamHolder;
using Catch::Contains;

namespace {

std::vector<debug::Finding> unordered_reuse_findings() {
  std::vector<debug::Finding> out;
  for (auto& f : debug::findings())
    if (f.kind == debug::kind::unordered_reuse) out.push_back(f);
  return out;
}

std::string site_line(int line) { return "test_graph_audit_gpu.cu:" + std::to_string(line) + " "; }

constexpr std::int64_t kBytes = 4 << 20;

}  // namespace

TEST_CASE("gpu: graph_topology gives the captured kernels and their edges", "[gpu][graph_audit]") {
  CudaBackend backend;
  StreamHolder s0, s1;
  DevBuf<std::uint32_t> buf(1024);
  backend.begin_capture(s0.s, CaptureMode::global);
  std::vector<const void*> first, after_fork;
  fill_kernel<<<1, 32, 0, s0.s>>>(buf.p, 1024, 1);
  REQUIRE(backend.capture_dependencies(s0.s, first));
  join(s0.s, s1.s);
  fill_kernel<<<1, 32, 0, s1.s>>>(buf.p, 512, 2);
  fill_kernel<<<1, 32, 0, s0.s>>>(buf.p + 512, 512, 3);
  join(s1.s, s0.s);
  fill_kernel<<<1, 32, 0, s0.s>>>(buf.p, 1024, 4);
  GraphHandle h = backend.end_capture(s0.s);
  GraphTopology topo;
  REQUIRE(backend.graph_topology(h, topo));
  CHECK(topo.nodes.size() == 4);  // events become edges, not nodes
  CHECK(topo.edges.size() == 4);  // a diamond
  REQUIRE(first.size() == 1);
  CHECK(std::find(topo.nodes.begin(), topo.nodes.end(), first[0]) != topo.nodes.end());
  CHECK(std::count_if(topo.edges.begin(), topo.edges.end(), [&](const auto& e) { return e.first == first[0]; }) == 2);
  backend.destroy(h);
}

TEST_CASE("gpu: the graph audit catches a reuse forced across unjoined streams; its joined twin is clean",
          "[gpu][graph_audit]") {
  for (bool joined : {false, true}) {
    DYNAMIC_SECTION((joined ? "joined after the release" : "forced over an unjoined stream")) {
      debug::clear_findings();
      CudaBackend cuda;
      ForcedReuseBackend backend(cuda);
      backend.force = !joined;  // the twin gets the real answer, and the join makes it true
      Arena arena(backend, ArenaOptions{.report_findings = false, .debug = true});
      StreamHolder s0, s1;
      arena.reserve(64 << 20, s0.s);
      DevBuf<unsigned long long> bad(1);
      Bindings b;
      int line_a = 0, line_b = 0;
      std::uintptr_t a_addr = 0, b_addr = 0;
      auto g = capture(arena, s0.s, b, [&](const Bindings& bb) {
        join(s0.s, s1.s);  // fork before the release
        {
          auto a = arena.request(s0.s, "A", kBytes, 1, capacity_bound, bb); line_a = __LINE__;
          a_addr = reinterpret_cast<std::uintptr_t>(a.data());
          fill(a, 0xA, s0.s);
          check(a, 0xA, bad.p, s0.s);
        }
        if (joined) join(s0.s, s1.s);  // s1 now follows A's release
        auto w = arena.request(s1.s, "B", kBytes, 1, capacity_bound, bb); line_b = __LINE__;
        b_addr = reinterpret_cast<std::uintptr_t>(w.data());
        fill(w, 0xB, s1.s);
        check(w, 0xB, bad.p, s1.s);
        join(s1.s, s0.s);
      });
      CHECK(b_addr == a_addr);  // reused in both
      CHECK(g.plan().entries()[1].reuses);
      const auto found = unordered_reuse_findings();
      if (joined) {
        CHECK(found.empty());
        for (int i = 0; i < 20; ++i) g.replay(b, s0.s);
        GRAPHSAFE_CUDA(cudaStreamSynchronize(s0.s));
        CHECK(bad.download(s0.s, 1)[0] == 0);
      } else {
        REQUIRE(found.size() == 1);
        CHECK(found[0].request == "B");
        CHECK_THAT(found[0].site, Contains(site_line(line_b)));
        CHECK_THAT(found[0].message, Contains("'A'") && Contains("'B'") && Contains(site_line(line_a)) &&
                                         Contains(site_line(line_b)));
      }
    }
  }
}
