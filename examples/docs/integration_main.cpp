// Runs the integration guide's before/after samples: capture at seq_lens [3, 5], replay at [15, 17].
// Before: the replay silently computes wrong results. After: it equals eager. Exit 0 when both
// behave as the guide says.
#include "integration_common.hpp"

#include <cstdio>

void record_step_before(graphsafe::HostStream& s, const std::vector<int>& lens_cpu, Device& dev,
                        std::vector<float>& buffer);

#include "integration_after.cpp"  // NOLINT: one translation unit keeps StepSymbols visible

int main() {
  using namespace graphsafe;
  HostBackend backend;
  Arena arena(backend);
  HostStream s;
  arena.reserve(1 << 20, s);
  Device dev;
  StepSymbols y;
  Bindings b;
  b.set(y.R, 2).set(y.W, kWindow).set(y.L, {3, 5});
  dev.lens = {3, 5};

  std::vector<float> buffer;
  auto before = capture(arena, s, b, [&](const Bindings&) { record_step_before(s, {3, 5}, dev, buffer); });
  auto after = capture(arena, s, b, [&](const Bindings& bb) { record_step_after(arena, s, y, bb, dev); });

  dev.lens = {15, 17};
  b.set(y.L, {15, 17});
  before.replay(b, s);  // nothing guards the buffer sized from [3, 5]
  const bool before_wrong = dev.out != expected(dev.lens);
  after.replay(b, s);
  const bool after_right = dev.out == expected(dev.lens);
  std::printf("before: replay after growth %s; after: replay %s\n", before_wrong ? "WRONG (as expected)" : "right?!",
              after_right ? "equals eager" : "WRONG");
  return before_wrong && after_right ? 0 : 1;
}
