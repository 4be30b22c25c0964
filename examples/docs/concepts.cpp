// Concepts in one program: symbols, extents, bindings, policies, plans, guards and a capture family
// (host backend). Each step prints what it shows.
#include <graphsafe/graphsafe.hpp>

#include <cstdio>

using namespace graphsafe;

int main() {
  // Symbols: static (fixed for a graph), dynamic with a capacity, batch (one value per request).
  const Symbol R = Symbol::fixed("requests");
  const Symbol W = Symbol::fixed("window");
  const Symbol L = Symbol::batch("seq_lens", R, /*capacity=*/512);

  // Extents: sizes written over symbols. N = max_b floor(L[b] / 4), G = max_b min(L[b], W).
  const Extent N = max_over(L, [](const Extent& l) { return floor_div(l, 4); });
  const Extent G = max_over(L, [&](const Extent& l) { return min(l, Extent(W)); });

  // Bindings: the values an engine has on the host anyway.
  Bindings b;
  b.set(R, 2).set(W, 4).set(L, {3, 5});
  std::printf("N = %s = %lld now, at most %lld\n", N.to_string().c_str(), static_cast<long long>(N.evaluate(b)),
              static_cast<long long>(N.capacity_bound(b)));

  // Policies: capacity_bound and static_query_bound are replay-safe; exact_at_capture is not.
  const StaticQueryBound swa_bound{Extent(W)};
  HostBackend backend;
  ArenaOptions options;
  options.report_findings = false;  // findings are read from the plans below
  Arena arena(backend, options);
  HostStream s;
  arena.reserve(1 << 20, s);
  CaptureFamily family = arena.family("decode");  // graphs replayed one at a time share one region

  CaptureOptions in_family;
  in_family.family = family;
  auto capture_with = [&](const SizingPolicy& n_policy, const SizingPolicy& g_policy) {
    return capture(arena, s, b, [&](const Bindings& bb) {
      const std::int64_t n = arena.dimension(s, "compressed_rows", N, n_policy, bb);  // an offset: guarded
      const std::int64_t g = arena.dimension(s, "swa_rows", G, g_policy, bb);
      auto ws = arena.request(s, "kv", Extent(R) * (n + g) * 512, 2, capacity_bound, bb);
      s.launch([p = ws.data()] { (void)p; /* kernels with n, g frozen */ });
    }, in_family);
  };
  CapturedGraph safe = capture_with(capacity_bound, swa_bound);
  CapturedGraph exact = capture_with(exact_at_capture, exact_at_capture);

  // Plans and guards: the safe plan's guards are discharged; the exact one reports a finding and
  // keeps live guards.
  std::printf("safe: %zu findings, %zu live guards; exact: %zu findings, %zu live guards\n",
              safe.plan().findings().size(), safe.plan().guard_count(), exact.plan().findings().size(),
              exact.plan().guard_count());
  std::printf("family region %llu bytes (separate regions would take %llu)\n",
              static_cast<unsigned long long>(family.region_bytes()),
              static_cast<unsigned long long>(family.sum_of_plan_bytes()));

  b.set(L, {15, 17});  // the sequences grew
  safe.replay(b, s);   // fine
  try {
    exact.replay(b, s);  // refused before launch
    return 1;
  } catch (const guard_failure& e) {
    std::printf("exact replay refused: %s\n", e.violations().front().request.c_str());
  }
  return 0;
}
