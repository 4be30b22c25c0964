// Consumer of the installed graphsafe package: capture on the host backend, replay, and check that
// the guard refuses a replay whose bindings need more than exact-at-capture reserved.
#include <graphsafe/graphsafe.hpp>

#include <cstdint>
#include <cstdio>
#include <vector>

using namespace graphsafe;

int main() {
  const Symbol R = Symbol::fixed("requests");
  const Symbol L = Symbol::batch("seq_lens", R, /*capacity=*/512);
  const Extent rows = sum_over(L, [](const Extent& l) { return ceil_div(l, 4); });

  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s;
  arena.reserve(1 << 16, s);

  Bindings b;
  b.set(R, 2).set(L, {3, 5});
  std::vector<int> lens = {3, 5};
  std::int64_t written = 0;
  auto graph = capture(arena, s, b, [&](const Bindings& bb) {
    auto ws = arena.request(s, "rows", rows, sizeof(std::int64_t), exact_at_capture, bb);
    std::int64_t* p = ws.as<std::int64_t>();
    s.launch([p, &lens, &written] {
      written = 0;
      for (int l : lens) written += (l + 3) / 4;
      for (std::int64_t i = 0; i < written; ++i) p[i] = i;
    });
  });
  int failures = 0;
  if (graph.plan().findings().empty()) {
    std::printf("FAIL: exact-at-capture on seq_lens was not reported at capture\n");
    ++failures;
  }
  graph.replay(b, s);  // capture-time bindings: allowed
  if (written != 3) {
    std::printf("FAIL: replay at [3, 5] wrote %lld rows, expected 3\n", static_cast<long long>(written));
    ++failures;
  }
  lens = {15, 17};
  b.set(L, {15, 17});
  written = -1;
  try {
    graph.replay(b, s);
    std::printf("FAIL: replay at [15, 17] was not refused\n");
    ++failures;
  } catch (const guard_failure& e) {
    std::printf("guard refused as expected: %s\n", e.what());
    if (written != -1) {
      std::printf("FAIL: the refused replay ran\n");
      ++failures;
    }
  }
  std::printf("install consumer: %s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
