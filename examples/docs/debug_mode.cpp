// A step whose workspace is sized exactly at capture, on the host backend: probe() finds the size
// that depends on the lengths, audit_replay() compares replays with eager runs and shows the guard
// refusing the replay that outgrows the capture.
#include <graphsafe/debug.hpp>
#include <graphsafe/graphsafe.hpp>

#include "debug_options.hpp"

#include <cstdint>
#include <cstdio>
#include <span>
#include <vector>

using namespace graphsafe;

int main() {
  const Symbol R = Symbol::fixed("requests");
  const Symbol L = Symbol::batch("seq_lens", R, /*capacity=*/512);
  const Extent rows = sum_over(L, [](const Extent& l) { return ceil_div(l, 4); });

  HostBackend backend;
  Arena arena(backend, debug_options());
  HostStream s;
  arena.reserve(1 << 20, s);

  std::vector<std::int64_t> lens;  // the step's input, put in place for each run by `prepare`
  std::vector<float> out(64);      // the step's output, compared byte for byte
  auto step = [&](const Bindings& b) {
    auto ws = arena.request(s, "rows", rows, sizeof(float), exact_at_capture, b);  // frozen at capture
    float* w = ws.as<float>();
    s.launch([w, &lens, &out] {
      std::size_t n = 0;
      for (std::int64_t l : lens) n += static_cast<std::size_t>((l + 3) / 4);
      for (std::size_t i = 0; i < n; ++i) w[i] = static_cast<float>(i);
      for (std::size_t i = 0; i < out.size(); ++i) out[i] = i < n ? w[i] : 0.0f;
    });
  };
  auto at = [&](std::initializer_list<std::int64_t> l) {
    Bindings b;
    b.set(R, 2).set(L, l);
    return b;
  };

  // The same step captured at two lengths: the workspace's size differs, so it is frozen at capture.
  const auto diffs = debug::probe(arena, s, step, at({3, 5}), at({15, 17}));

  debug::AuditOptions ao;
  ao.prepare = [&](const Bindings& b) {
    const auto v = b.values(L);
    lens.assign(v.begin(), v.end());
  };
  const auto steps = debug::audit_replay(
      arena, s, step, [&] { return std::as_bytes(std::span(out)); },  // output to compare
      at({3, 5}), {at({4, 4}), at({15, 17})}, ao);

  std::printf("probe: %zu difference(s); audit: [4, 4] %s, [15, 17] %s\n", diffs.size(),
              steps[0].equal ? "equal" : "DIFFERS", steps[1].refused ? "refused by the guard" : "NOT REFUSED");
  return !diffs.empty() && steps[0].equal && steps[1].refused ? 0 : 1;
}
