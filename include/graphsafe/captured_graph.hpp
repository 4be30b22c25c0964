// Capture and replay.
//
//   auto graph = graphsafe::capture(arena, stream, bindings, [&](const graphsafe::Bindings& b) {
//     auto ws = arena.request(stream, "kv", rows, 1024, graphsafe::capacity_bound, b);
//     my_kernel<<<grid, block, 0, stream>>>(ws.as<bf16>(), d_seq_lens);
//   });
//   bindings.set(seq_lens, {15, 17});          // sequences grew
//   graph.replay(bindings, stream);            // guards first; refused (never launched) if unsafe
//
// CaptureSession is the RAII form: it starts routing requests to its plan *before*
// cudaStreamBeginCapture, matches requests by capture id (streams forked into the capture from any
// thread count), and if the capture fails or is abandoned (exception, early return) it ends the
// capture and releases everything it acquired.
#pragma once

#include <graphsafe/arena.hpp>
#include <graphsafe/plan.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <source_location>
#include <span>

namespace graphsafe {

struct VirtualGraphStats;  // graphsafe/virtual_memory.hpp

namespace detail {
struct GraphState;
struct SessionState;
}  // namespace detail

struct CaptureOptions {
  // Graphs of one family share a region (replayed one at a time on one stream). Empty: the graph
  // gets a family of its own.
  std::optional<CaptureFamily> family;
  CaptureMode mode = CaptureMode::global;
  // Called when a replay's guards fail. Return the bindings to re-capture with (e.g. rounded up to
  // the next bucket) and the graph re-captures itself and replays; return nullopt to refuse.
  // Only graphs made by capture(...) (which keeps the capture function) can re-capture.
  std::function<std::optional<Bindings>(const Bindings& refused)> recapture;
};

class CapturedGraph;
template <class Fn>
CapturedGraph capture(Arena& arena, Stream s, const Bindings& b, Fn&& fn, CaptureOptions opts = {});

// What capturing will take, known before any memory is: size the arena (and the KV cache beside
// it) from this, then capture.
//
//   auto need = graphsafe::estimate(arena, stream, buckets, step, {.family = family});
//   arena.reserve(need.region_bytes, stream);
//   for (auto& b : buckets) graphs.push_back(graphsafe::capture(arena, stream, b, step, {.family = family}));
//
// Each bucket's function runs once in a planning capture: the stream captures (nothing runs),
// requests are sized and placed exactly as a capture places them, at addresses no memory backs,
// and the capture is discarded. With a family, the placement (the better of the one made and an
// offline packing over the recorded lifetimes) is kept for the family's later captures, which
// follow it: capturing the same buckets in the same order gives region_bytes exactly. The
// placeholder addresses may be kernel arguments; a call that validates a workspace's address at
// capture time (a memset or memcpy node, on some drivers) may refuse them.
struct CaptureEstimate {
  std::uint64_t region_bytes = 0;     // the region the captures need (a family: the largest)
  std::uint64_t peak_live_bytes = 0;  // lower bound: workspaces live at once, at most
  std::uint64_t requests = 0;         // requests recorded, over all buckets
};
namespace detail {
CaptureEstimate estimate_capture(Arena& arena, Stream s, std::span<const Bindings> buckets,
                                 const std::function<void(const Bindings&)>& fn, const CaptureOptions& opts);
}
template <class Fn>
CaptureEstimate estimate(Arena& arena, Stream s, std::span<const Bindings> buckets, Fn&& fn, CaptureOptions opts = {}) {
  return detail::estimate_capture(arena, s, buckets, std::function<void(const Bindings&)>(std::forward<Fn>(fn)), opts);
}
template <class Fn>
CaptureEstimate estimate(Arena& arena, Stream s, const Bindings& b, Fn&& fn, CaptureOptions opts = {}) {
  return estimate(arena, s, std::span<const Bindings>(&b, 1), std::forward<Fn>(fn), std::move(opts));
}

// Destroying a graph never blocks: CUDA frees an in-flight executable graph when its launches
// complete, and the graph's region returns to the arena ordered after the last replay's stream.
// That stream must still exist when the region is reused on another stream (as with any
// stream-ordered allocator): destroy graphs before the streams they were replayed on.
class CapturedGraph {
 public:
  CapturedGraph(CapturedGraph&&) noexcept;
  CapturedGraph& operator=(CapturedGraph&&) noexcept;
  ~CapturedGraph();

  // Check the guards for `b`, then launch on `s`. A failing guard never launches: it throws
  // guard_failure (naming request, symbol, value and limit) or re-captures (CaptureOptions::recapture).
  // `loc` names the call site in debug findings (concurrent replays of one family).
  void replay(const Bindings& b, Stream s, std::source_location loc = std::source_location::current());
  // Launch without checking guards. Exists so tests can show what the guards prevent.
  void replay_unguarded_for_testing(Stream s);
  // Virtual growth (ArenaOptions::virtual_memory): map what `b` needs, as replay() does after its
  // guards, without launching (no-op for an ordinary graph). Guards are not checked here.
  void commit(const Bindings& b);
  // Virtual growth: reservation, committed bytes, commit counters; with bindings, their exact need.
  VirtualGraphStats virtual_stats(const Bindings* b = nullptr) const;

  const Plan& plan() const;
  std::uint64_t reserved_bytes() const;  // bytes of this graph's plan
  std::uint64_t recaptures() const;
  CaptureFamily family() const;
  const GraphHandle& handle() const;
 private:
  friend struct detail::InternalAccess;
  friend class CaptureSession;
  template <class Fn>
  friend CapturedGraph capture(Arena&, Stream, const Bindings&, Fn&&, CaptureOptions);
  explicit CapturedGraph(std::unique_ptr<detail::GraphState> s);
  void set_recapture(std::function<void(const Bindings&)> fn, Stream s);
  std::unique_ptr<detail::GraphState> state_;
};

class CaptureSession {
 public:
  CaptureSession(Arena& arena, Stream s, const Bindings& b, CaptureOptions opts = {});
  ~CaptureSession();  // abandons the capture if finish() was not called
  CaptureSession(const CaptureSession&) = delete;
  CaptureSession& operator=(const CaptureSession&) = delete;

  // End the capture, instantiate, and hand the plan and region to the graph.
  CapturedGraph finish();
  const Plan& plan() const;

 private:
  std::unique_ptr<detail::SessionState> state_;
};

// Capture `fn(bindings)` on `s` into a graph. Exceptions from fn abandon the capture cleanly.
template <class Fn>
CapturedGraph capture(Arena& arena, Stream s, const Bindings& b, Fn&& fn, CaptureOptions opts) {
  const bool keep = static_cast<bool>(opts.recapture);
  std::function<void(const Bindings&)> f(std::forward<Fn>(fn));
  CaptureSession session(arena, s, b, opts);
  f(b);
  CapturedGraph g = session.finish();
  if (keep) g.set_recapture(std::move(f), s);
  return g;
}

}  // namespace graphsafe
