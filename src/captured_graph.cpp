#include "arena_core.hpp"
#include "internal_access.hpp"
#include "virtual_commit.hpp"

#include <graphsafe/error.hpp>

#include <mutex>

namespace graphsafe {
namespace detail {
void start_session(SessionState& st, const Bindings& b);
void abandon_session(SessionState& st) noexcept;
std::unique_ptr<GraphState> finish_session(SessionState& st);

void destroy_graph(GraphState& g) noexcept {
  if (!g.handle.exec && !g.handle.graph) return;
  ArenaCore& core = *g.core;
  // Replays may still be in flight. The exec is freed by CUDA when they complete
  // (cudaGraphExecDestroy), and the region goes back tagged with the last replay's stream, so any
  // reuse is ordered after it: no synchronization here (the stream may even be gone already).
  // Virtual regions unmap physical memory, which must wait for the replays.
  if (g.family->virt && g.family->last_stream) [[unlikely]] {
    try {
      core.backend.synchronize(tagged_stream(g.family->last_stream));
    } catch (...) {
    }
  }
  if (core.observer) [[unlikely]] core.observer->graph_destroyed(g);
  core.backend.destroy(g.handle);
  g.handle = {};
  core.regions->graph_destroyed(*g.family, stream_tag(g.stream));
}

// Graphs of one family share a region, so their replays are serialized: ordering after the last
// replay's stream, the launch and recording this stream as the last happen under the family's
// replay mutex (two threads would otherwise both order after the same earlier replay and run
// together). The last stream changes only once the launch went through.
void launch_in_family(GraphState& g, Stream s, const std::source_location& loc) {
  ArenaCore& core = *g.core;
  Family& f = *g.family;
  std::lock_guard serial(f.replay_mutex);
  void* last;
  {
    std::lock_guard lk(core.lock);  // finish_session and graph_destroyed use it under the arena's lock
    last = f.last_stream;
  }
  if (last && last != stream_tag(s)) core.backend.order_after(s, tagged_stream(last));
  if (core.observer) [[unlikely]] core.observer->replay_begin(g, s, last, loc);
  core.backend.launch(g.handle, s);
  {
    std::lock_guard lk(core.lock);
    f.last_stream = stream_tag(s);
  }
  if (core.observer) [[unlikely]] core.observer->replay_end(g, s);
}
}  // namespace detail

CapturedGraph::CapturedGraph(std::unique_ptr<detail::GraphState> s) : state_(std::move(s)) {}
CapturedGraph::CapturedGraph(CapturedGraph&&) noexcept = default;
CapturedGraph& CapturedGraph::operator=(CapturedGraph&& o) noexcept {
  if (this != &o) {
    if (state_) detail::destroy_graph(*state_);
    state_ = std::move(o.state_);
  }
  return *this;
}
CapturedGraph::~CapturedGraph() {
  if (state_) detail::destroy_graph(*state_);
}

void CapturedGraph::set_recapture(std::function<void(const Bindings&)> fn, Stream s) {
  state_->fn = std::move(fn);
  state_->stream = s;
}

namespace {
detail::GraphState& live(const std::unique_ptr<detail::GraphState>& s) {
  if (!s || (!s->handle.exec && !s->handle.graph))
    throw capture_state_error("graphsafe: replay of a graph that was moved from or destroyed (a failed re-capture "
                              "destroys the old graph); capture it again");
  return *s;
}
}  // namespace

void CapturedGraph::replay(const Bindings& b, Stream s, std::source_location loc) {
  detail::GraphState& g = live(state_);
  detail::ArenaCore& core = *g.core;
  if (core.active_sessions.load(std::memory_order_acquire) > 0 && core.backend.capture_info(s).active)
    throw capture_state_error("graphsafe: replay() on a stream that is capturing; replay after the capture ends "
                              "(to nest graphs, capture the work itself)");
  if (auto v = g.plan.check(b); !v.empty()) {
    std::optional<Bindings> bucket;
    if (g.opts.recapture && g.fn) bucket = g.opts.recapture(b);
    if (!bucket) g.plan.enforce(b);  // throws guard_failure naming request, symbol, value and limit
    // Re-capture at the caller's bucket: the old graph goes first so its region can be reused.
    auto fn = std::move(g.fn);
    auto opts = g.opts;
    const auto recaptures = g.recaptures;
    detail::destroy_graph(g);
    detail::SessionState st;
    st.core = g.core;
    st.stream = s;
    st.family = g.family;
    st.opts = opts;
    detail::start_session(st, *bucket);
    try {
      fn(*bucket);
    } catch (...) {
      detail::abandon_session(st);
      throw;
    }
    state_ = detail::finish_session(st);
    state_->fn = std::move(fn);
    state_->recaptures = recaptures + 1;
    state_->plan.enforce(b);  // the bucket must cover the bindings that asked for it
  }
  detail::GraphState& cur = *state_;
  // Virtual growth: map what these bindings need (a compare per request when nothing grew).
  if (cur.virt) [[unlikely]] {
    detail::virtual_commit(*cur.virt, b);
    if (detail::virtual_guards_unmapped(*cur.virt)) cur.armed = false;  // debug: re-arm remapped guards
  }
  detail::launch_in_family(cur, s, loc);
}

void CapturedGraph::replay_unguarded_for_testing(Stream s) {
  detail::GraphState& g = live(state_);
  // As replay() after its guards: the capture's own bindings say what to map.
  if (g.virt) [[unlikely]] {
    detail::virtual_commit(*g.virt, g.plan.captured_bindings());
    if (detail::virtual_guards_unmapped(*g.virt)) g.armed = false;
  }
  detail::launch_in_family(g, s, std::source_location::current());
}

const Plan& CapturedGraph::plan() const { return live(state_).plan; }
std::uint64_t CapturedGraph::reserved_bytes() const { return live(state_).plan.bytes(); }
std::uint64_t CapturedGraph::recaptures() const { return live(state_).recaptures; }
CaptureFamily CapturedGraph::family() const { return detail::family_handle(live(state_).family); }
const GraphHandle& CapturedGraph::handle() const { return live(state_).handle; }

}  // namespace graphsafe
