#include "arena_core.hpp"
#include "graph_audit.hpp"

#include <graphsafe/error.hpp>

#include <algorithm>
#include <cstdio>
#include <mutex>

#include "internal_access.hpp"  // Arena and CaptureFamily handles to their state

namespace graphsafe {
namespace detail {

namespace {
void unregister(SessionState& st) {
  if (!st.registered) return;
  ArenaCore& core = *st.core;
  {
    std::lock_guard g(core.lock);
    core.sessions.erase(std::remove(core.sessions.begin(), core.sessions.end(), &st), core.sessions.end());
  }
  core.active_sessions.fetch_sub(1, std::memory_order_acq_rel);
  st.registered = false;
}
}  // namespace

void start_session(SessionState& st, const Bindings& b) {
  ArenaCore& core = *st.core;
  if (st.family->arena_id != core.id)
    throw invalid_argument_error(
        "graphsafe: capture family '" + st.family->name + "' " +
        (st.family->arena_id ? "belongs to arena #" + std::to_string(st.family->arena_id) : std::string("has no arena")) +
        " but this capture is on arena #" + std::to_string(core.id) +
        "; a family's graphs share one region of one arena -- make the family with this arena's family()");
  if (core.backend.capture_info(st.stream).active)
    throw capture_state_error("graphsafe: this stream is already capturing; a capture cannot start inside another "
                              "(end the outer capture first, or capture on another stream)");
  st.plan.set_captured_bindings(b);
  {
    std::lock_guard g(core.lock);
    st.plan.reserve(core.plan_entries_hint);
  }
  if (st.planning) {
    // An estimate takes nothing: its requests are placed at addresses no memory backs (never
    // launched: the capture is discarded).
    if (core.opts.virtual_memory)
      throw invalid_argument_error("graphsafe: estimate() with virtual growth: a virtual family reserves address "
                                   "space, not a region; read VirtualGraphStats after capturing instead");
    st.base = kPlanningBase;
    st.limit = 1ull << 62;
  } else {
    core.regions->begin_capture(st);  // takes the region to capture into; throws if there is none
  }
  // The region's memory may have been used eagerly on another stream: order the capture stream
  // after it now, in eager order, so every later replay on this stream follows that work.
  auto order = [&](Block* blk) {
    if (blk && blk->stream && blk->stream != stream_tag(st.stream))
      core.backend.order_after(st.stream, tagged_stream(blk->stream));
  };
  try {
    st.placement = make_placement(core, st);  // follows the family's earlier layouts
    order(st.provisional);
    order(st.next_held);
    if (st.family->last_stream && st.family->last_stream != stream_tag(st.stream))
      core.backend.order_after(st.stream, tagged_stream(st.family->last_stream));
    // Route requests to this session before the capture starts (as PyTorch does): matched by the
    // capture id, which the backend assigns at begin.
    {
      std::lock_guard g(core.lock);
      core.sessions.push_back(&st);
    }
    core.active_sessions.fetch_add(1, std::memory_order_acq_rel);
    st.registered = true;
    core.backend.begin_capture(st.stream, st.opts.mode);
    st.begun = true;
    const CaptureInfo ci = core.backend.capture_info(st.stream);
    {
      std::lock_guard g(core.lock);
      st.capture_id = ci.id;
    }
    if (core.observer && !st.planning) [[unlikely]] core.observer->capture_begin(st);
  } catch (...) {
    unregister(st);
    if (!st.planning) core.regions->end_capture(st, false);
    throw;
  }
}

void abandon_session(SessionState& st) noexcept {
  if (st.done) return;
  st.done = true;
  if (st.begun) st.core->backend.abort_capture(st.stream);
  unregister(st);
  if (st.planning) return;
  ArenaCore& core = *st.core;
  core.regions->end_capture(st, false);
  if (core.observer) [[unlikely]] core.observer->capture_end(st, false);
}

CaptureEstimate finish_estimate(SessionState& st) {
  ArenaCore& core = *st.core;
  st.done = true;
  core.backend.abort_capture(st.stream);  // nothing of the planning capture is kept
  unregister(st);
  st.placement->finish(st);  // with a family: its later captures follow the best layout
  CaptureEstimate e;
  st.placement->estimate(static_cast<bool>(st.opts.family), e);
  e.requests = st.plan.entries().size();
  return e;
}

std::unique_ptr<GraphState> finish_session(SessionState& st) {
  if (st.done) throw capture_state_error("graphsafe: CaptureSession::finish() called twice; a session makes one graph");
  ArenaCore& core = *st.core;
  GraphHandle h;
  try {
    h = core.backend.end_capture(st.stream);
  } catch (...) {
    abandon_session(st);
    throw;
  }
  // Graphs of the family may have replayed on other streams while this one captured (begin ordered
  // the stream only after the replays before it): this graph's first replay must follow them. The
  // family's replays wait until this stream is recorded as its last.
  std::unique_lock serial(st.family->replay_mutex);
  // The backend has instantiated the graph: from here a failure must destroy it and give back the
  // region. Everything that may throw (allocations) runs before end_capture hands the region to the
  // family; a failure then is an abandoned capture.
  std::unique_ptr<GraphState> g;
  try {
    void* last;
    {
      std::lock_guard lk(core.lock);
      last = st.family->last_stream;
    }
    if (last && last != stream_tag(st.stream)) core.backend.order_after(st.stream, tagged_stream(last));
    st.plan.set_bytes(align_up(st.bump, kAlignment));
    st.placement->finish(st);  // lifetimes, lower bound and best layout into the plan and family
    {
      std::lock_guard lk(core.lock);
      core.plan_entries_hint = st.plan.entries().size();
    }
    st.plan.finalize();
    // Debug mode: prove on the instantiated graph that every reused range is ordered (findings).
    if (core.opts.debug) [[unlikely]] audit_captured_graph(st, h);
    g = std::make_unique<GraphState>();
    g->opts = st.opts;
  } catch (...) {
    core.backend.destroy(h);
    st.begun = false;  // the capture has ended: nothing to abort
    abandon_session(st);
    throw;
  }
  st.done = true;
  unregister(st);
  try {
    core.regions->end_capture(st, true);  // commit: moves blocks between trees (descriptors are pooled)
  } catch (...) {
    core.backend.destroy(h);  // virtual growth registers the plan with its family (an allocation)
    if (core.observer) [[unlikely]] core.observer->capture_end(st, false);
    throw;
  }
  if (core.observer) [[unlikely]] core.observer->capture_end(st, true);
  if (core.opts.report_findings && !core.opts.debug && !st.plan.findings().empty()) {
    std::fprintf(stderr, "graphsafe: capture of family '%s' has %zu finding(s):\n", st.family->name.c_str(),
                 st.plan.findings().size());
    for (const auto& f : st.plan.findings())
      std::fprintf(stderr, "  [%s] %s: %s\n", f.request.c_str(), f.site.c_str(), f.message.c_str());
  }
  g->core = st.core;
  g->family = st.family;
  g->handle = h;
  g->plan = std::move(st.plan);
  g->stream = st.stream;
  g->base = st.base;
  g->virt = std::move(st.virt);  // virtual growth (null otherwise)
  g->dbg_pointers = std::move(st.dbg_pointers);  // debug mode (empty otherwise)
  {
    std::lock_guard lk(core.lock);
    ++st.family->graphs;
    ++core.live_graphs;
    st.family->last_stream = stream_tag(st.stream);
  }
  serial.unlock();
  // Debug mode: the capture's report on stderr (findings of all kinds), NVTX registration. The graph
  // is whole by now: if an observer fails, it is destroyed as any graph is.
  if (core.observer) [[unlikely]] {
    try {
      core.observer->graph_created(st, *g);
    } catch (...) {
      destroy_graph(*g);
      throw;
    }
  }
  return g;
}

std::shared_ptr<Family> family_of(const CaptureOptions& o, const std::shared_ptr<ArenaCore>& core) {
  if (o.family) return impl_of(*o.family);
  auto f = std::make_shared<Family>();
  f->name = "graph";
  f->arena_id = core->id;
  f->arena = core;
  return f;
}

CaptureEstimate estimate_capture(Arena& arena, Stream s, std::span<const Bindings> buckets,
                                 const std::function<void(const Bindings&)>& fn, const CaptureOptions& opts) {
  CaptureEstimate total;
  for (const Bindings& b : buckets) {
    SessionState st;
    st.core = core_of(arena).shared_from_this();
    st.stream = s;
    st.family = family_of(opts, st.core);
    st.opts = opts;
    st.planning = true;
    start_session(st, b);
    try {
      fn(b);
    } catch (...) {
      abandon_session(st);
      throw;
    }
    const CaptureEstimate e = finish_estimate(st);
    total.region_bytes = std::max(total.region_bytes, e.region_bytes);
    total.peak_live_bytes = std::max(total.peak_live_bytes, e.peak_live_bytes);
    total.requests += e.requests;
  }
  return total;
}

}  // namespace detail

CaptureSession::CaptureSession(Arena& arena, Stream s, const Bindings& b, CaptureOptions opts)
    : state_(std::make_unique<detail::SessionState>()) {
  state_->core = detail::core_of(arena).shared_from_this();
  state_->stream = s;
  state_->family = detail::family_of(opts, state_->core);
  state_->opts = std::move(opts);
  detail::start_session(*state_, b);
}

CaptureSession::~CaptureSession() {
  if (state_) detail::abandon_session(*state_);
}

CapturedGraph CaptureSession::finish() { return CapturedGraph(detail::finish_session(*state_)); }

const Plan& CaptureSession::plan() const { return state_->plan; }

}  // namespace graphsafe
