#include <graphsafe/error.hpp>
#include <graphsafe/host_backend.hpp>

#include "environment.hpp"

#include <algorithm>
#include <atomic>
#include <span>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <string_view>
#include <utility>

namespace graphsafe {
namespace detail {
std::string site_of(const std::source_location& loc);  // src/arena.cpp

// A capture under way: nodes (work with the ranges it declared) with their dependencies, the
// streams that joined it.
struct HostCapture {
  // Dependencies of every node in one array (no allocation per launch): node i's are
  // dep_list[dep_first[i], dep_first[i + 1]).
  std::uint64_t id = 0;
  HostStream* origin = nullptr;
  std::vector<HostWork> nodes;
  std::vector<std::uint32_t> dep_first{0};
  std::vector<std::uint32_t> dep_list;
  std::vector<HostStream*> joined;  // streams that joined through an event (the origin excluded)

  std::span<const std::uint32_t> deps(std::uint32_t n) const {
    return {dep_list.data() + dep_first[n], dep_first[n + 1] - dep_first[n]};
  }
  std::uint32_t add(HostWork work, const std::vector<std::uint32_t>& deps) {
    nodes.push_back(std::move(work));
    dep_list.insert(dep_list.end(), deps.begin(), deps.end());
    dep_first.push_back(static_cast<std::uint32_t>(dep_list.size()));
    return static_cast<std::uint32_t>(nodes.size() - 1);
  }
  // Whether every node of `targets` is one of `from` or an ancestor of one.
  bool reaches(const std::vector<std::uint32_t>& from, std::vector<std::uint32_t> targets) const {
    if (targets.empty()) return true;
    std::vector<char> seen(nodes.size(), 0);
    std::vector<std::uint32_t> stack(from);
    while (!stack.empty() && !targets.empty()) {
      const std::uint32_t n = stack.back();
      stack.pop_back();
      if (seen[n]) continue;
      seen[n] = 1;
      std::erase(targets, n);
      for (std::uint32_t d : deps(n)) stack.push_back(d);
    }
    return targets.empty();
  }
};

// The seeded mode's queues, clocks and race checker (host_backend.hpp says what it does). One
// recursive mutex guards it all and work runs under it: work may launch more work, and one
// operation at a time keeps a seed's interleaving reproducible on one thread.
struct HostScheduler {
  using Clock = std::vector<std::uint64_t>;  // per stream id: the last epoch ordered before
  struct Access {
    std::uint32_t stream;
    std::uint64_t epoch;
    bool write;
    std::shared_ptr<const std::string> site;
  };
  using AccessRef = std::shared_ptr<const Access>;
  // Disjoint byte ranges, each with its last write and the reads since (FastTrack's shadow state,
  // with full read sets: reads on several streams may all be unordered with a later write).
  struct Segment {
    std::uintptr_t end;
    AccessRef write;
    std::vector<AccessRef> reads;
  };
  struct Op {
    HostWork work;
    bool wait = false;  // a wait marker: runnable once stream `on` completed `count` operations
    std::uint32_t on = 0;
    std::uint64_t count = 0;
  };
  struct StreamState {
    HostStream* owner = nullptr;  // nullptr once the stream is destroyed
    std::deque<Op> queue;
    std::uint64_t enqueued = 0, done = 0;  // operations (not wait markers)
    Clock clock;
  };

  std::recursive_mutex m;
  std::uint64_t rng;
  std::uint32_t max_queued;
  std::vector<StreamState> streams;
  Clock host;  // what the host waited for: every later operation is ordered after it
  std::size_t queued = 0;
  std::map<std::uintptr_t, Segment> shadow;
  std::vector<HostRace> races;

  HostScheduler(std::uint64_t seed, std::uint32_t mq) : rng(seed), max_queued(mq) {}

  std::uint64_t next() {  // splitmix64
    std::uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  static void join(Clock& into, const Clock& from) {
    if (into.size() < from.size()) into.resize(from.size(), 0);
    for (std::size_t i = 0; i < from.size(); ++i) into[i] = std::max(into[i], from[i]);
  }
  static bool ordered(const Access& a, const Clock& c) { return a.stream < c.size() && a.epoch <= c[a.stream]; }

  std::uint32_t add_stream(HostStream* h) {
    streams.emplace_back();
    streams.back().owner = h;
    return static_cast<std::uint32_t>(streams.size() - 1);
  }

  // Split the shadow so that `at` starts a segment (if a segment covers it).
  void split(std::uintptr_t at) {
    auto it = shadow.upper_bound(at);
    if (it == shadow.begin()) return;
    --it;
    if (it->first == at || it->second.end <= at) return;
    Segment tail = it->second;
    it->second.end = at;
    shadow.emplace(at, std::move(tail));
  }

  void report(const Access& prev, const Access& cur, std::uintptr_t b, std::uintptr_t e) {
    for (HostRace& r : races)  // one report per pair of operations, over the bytes they share
      if (r.first_site == *prev.site && r.second_site == *cur.site && r.first_stream == prev.stream &&
          r.second_stream == cur.stream && r.end >= b && r.begin <= e) {
        r.begin = std::min(r.begin, b);
        r.end = std::max(r.end, e);
        return;
      }
    races.push_back({b, e, *prev.site, *cur.site, prev.write, cur.write, prev.stream, cur.stream});
  }

  // Check one access of the operation whose clock is `c` against the shadow, then record it.
  void access(const HostAccess& a, const AccessRef& cur, const Clock& c) {
    if (!a.p || a.bytes == 0) return;
    const auto b = reinterpret_cast<std::uintptr_t>(a.p);
    const std::uintptr_t e = b + a.bytes;
    split(b);
    split(e);
    std::uintptr_t at = b;
    auto it = shadow.lower_bound(b);
    while (at < e) {
      if (it == shadow.end() || it->first > at) {  // a gap nobody touched yet
        const std::uintptr_t gap_end = it == shadow.end() ? e : std::min(e, it->first);
        Segment s{gap_end, nullptr, {}};
        if (cur->write) s.write = cur;
        else s.reads.push_back(cur);
        it = std::next(shadow.emplace_hint(it, at, std::move(s)));
        at = gap_end;
        continue;
      }
      Segment& s = it->second;
      if (s.write && !ordered(*s.write, c)) report(*s.write, *cur, it->first, s.end);
      if (cur->write) {
        for (const AccessRef& r : s.reads)
          if (!ordered(*r, c)) report(*r, *cur, it->first, s.end);
        s.write = cur;
        s.reads.clear();
      } else {
        std::erase_if(s.reads, [&](const AccessRef& r) { return ordered(*r, c); });
        s.reads.push_back(cur);
      }
      at = s.end;
      ++it;
    }
  }

  void forget(std::uintptr_t b, std::uintptr_t e) {
    split(b);
    split(e);
    shadow.erase(shadow.lower_bound(b), shadow.lower_bound(e));
  }

  // Give stream `id` its next epoch (after what the host waited for) and check `touches` with it.
  void stamp(std::uint32_t id, const std::vector<HostAccess>& touches, const std::string& site) {
    StreamState& st = streams[id];
    join(st.clock, host);
    if (st.clock.size() <= id) st.clock.resize(id + 1, 0);
    const std::uint64_t epoch = ++st.clock[id];
    if (touches.empty()) return;
    auto s = std::make_shared<const std::string>(site);
    for (const HostAccess& a : touches) access(a, std::make_shared<const Access>(Access{id, epoch, a.write, s}), st.clock);
  }

  void enqueue(std::uint32_t id, HostWork w) {
    stamp(id, w.touches, w.site);
    StreamState& st = streams[id];
    st.queue.push_back({std::move(w), false, 0, 0});
    ++st.enqueued;
    ++queued;
    // The seed decides how much may stay queued after this launch, so the streams' work interleaves.
    const std::uint64_t keep = next() % (std::uint64_t{max_queued} + 1);
    while (queued > keep) run_one();
  }

  // Run (or retire) the head of one runnable stream, chosen by the seed.
  void run_one() {
    std::size_t runnable = 0;
    for (const StreamState& st : streams) runnable += head_ready(st);
    if (runnable == 0) return;  // cannot happen: waits name work queued before them
    std::size_t pick = next() % runnable;
    for (std::size_t i = 0; i < streams.size(); ++i) {
      if (!head_ready(streams[i]) || pick-- != 0) continue;
      Op op = std::move(streams[i].queue.front());
      streams[i].queue.pop_front();
      if (op.wait) return;
      --queued;
      // By index: work may bind a new stream (the vector grows). A throw still completes the operation.
      struct Done {
        HostScheduler& sc;
        std::size_t i;
        ~Done() { ++sc.streams[i].done; }
      } done{*this, i};
      if (op.work.run) op.work.run();
      return;
    }
  }
  bool head_ready(const StreamState& st) const {
    if (st.queue.empty()) return false;
    const Op& op = st.queue.front();
    return !op.wait || streams[op.on].done >= op.count;
  }
  void drain(std::uint32_t id) {
    const std::uint64_t target = streams[id].enqueued;
    while (streams[id].done < target) run_one();
  }
  void drain_all() {
    while (queued) run_one();
    for (StreamState& st : streams) st.queue.clear();  // satisfied waits
  }
};

}  // namespace detail

std::string HostRace::describe() const {
  auto what = [](bool w) { return w ? "write" : "read"; };
  return std::string("graphsafe: unordered accesses to bytes [") + std::to_string(begin) + ", " + std::to_string(end) +
         "): " + what(first_write) + " by " + first_site + " on host stream #" + std::to_string(first_stream) + ", then " +
         what(second_write) + " by " + second_site + " on host stream #" + std::to_string(second_stream) +
         " with no order_after / synchronize between them";
}

Stream::Stream(HostStream& s) : handle_(static_cast<void*>(&s)) {}

HostStream::HostStream(HostBackend& backend) { (void)backend.host(Stream(*this)); }

HostStream::~HostStream() {
  if (capture_ && capture_->origin != this) std::erase(capture_->joined, this);
  if (capture_ && capture_->origin == this) capture_->origin = nullptr;
  if (!backend_) return;
  detail::HostScheduler& sc = *backend_->sched_;
  std::lock_guard g(sc.m);
  sc.drain(id_);  // a destroyed stream's work still completes
  sc.streams[id_].owner = nullptr;
}

void HostStream::launch(std::function<void()> work, std::vector<HostAccess> touches, std::source_location loc) {
  if (capture_) {
    // The site names a race, which needs declared ranges: no string for work that declares none.
    std::string site = touches.empty() ? std::string() : detail::site_of(loc);
    const std::uint32_t n = capture_->add({std::move(work), std::move(touches), std::move(site)}, deps_);
    deps_.assign(1, n);  // keeps its capacity: no allocation per launch
  } else if (backend_) {  // set only by a seeded backend
    detail::HostScheduler& sc = *backend_->sched_;
    std::lock_guard g(sc.m);
    sc.enqueue(id_, {std::move(work), std::move(touches), detail::site_of(loc)});
  } else {
    work();
  }
}

void HostStream::record(HostEvent& e) {
  e.capture_ = capture_;
  e.capture_id_ = capture_id_;
  e.nodes_ = capture_ ? deps_ : std::vector<std::uint32_t>{};
  e.stream_ = capture_ ? nullptr : this;
}

void HostStream::wait(const HostEvent& e) {
  if (!e.capture_) {
    // Eager: in seeded mode, this stream's later work follows the recording stream's work so far.
    if (e.stream_ && e.stream_ != this && backend_ && e.stream_->backend_ == backend_)
      backend_->order_after(Stream(*this), Stream(*e.stream_));
    return;
  }
  if (capture_ && capture_ != e.capture_)
    throw capture_state_error("graphsafe: host stream capturing (capture id " + std::to_string(capture_id_) +
                              ") waits on an event recorded in capture " + std::to_string(e.capture_id_) +
                              "; CUDA invalidates a capture that waits on another capture's event");
  if (!e.capture_->origin)
    throw capture_state_error("graphsafe: host stream waits on an event of capture " + std::to_string(e.capture_id_) +
                              ", which has ended; record the event again");
  if (!capture_) {
    // Joins the capture: its next work follows the event's position.
    capture_ = e.capture_;
    capture_id_ = e.capture_id_;
    deps_ = e.nodes_;
    capture_->joined.push_back(this);
    return;
  }
  for (std::uint32_t n : e.nodes_)
    if (std::find(deps_.begin(), deps_.end(), n) == deps_.end()) deps_.push_back(n);
}

namespace {
std::atomic<std::uint64_t> next_capture_id{1};
// An instantiated host graph: the capture's nodes in one topological order.
struct HostGraph {
  std::vector<HostWork> work;
  // Per captured node (capture order), for graph_topology: node i's dependencies are
  // dep_list[dep_first[i], dep_first[i + 1]).
  std::vector<std::uint32_t> dep_first;
  std::vector<std::uint32_t> dep_list;
};

// Kahn's algorithm taking the most recently captured ready node first: concurrent branches run in
// an order other than capture order, so work that lacks a dependency runs too early and shows.
std::vector<std::uint32_t> replay_order(const detail::HostCapture& c) {
  const std::size_t n = c.nodes.size();
  std::vector<std::uint32_t> waiting(n, 0);
  // Successors in one array (offsets per node): no allocation per node.
  std::vector<std::uint32_t> first(n + 1, 0);
  for (std::uint32_t i = 0; i < n; ++i)
    for (std::uint32_t d : c.deps(i)) {
      ++waiting[i];
      ++first[d + 1];
    }
  for (std::size_t i = 0; i < n; ++i) first[i + 1] += first[i];
  std::vector<std::uint32_t> succ(first[n]);
  std::vector<std::uint32_t> fill(first.begin(), first.end() - 1);
  for (std::uint32_t i = 0; i < n; ++i)
    for (std::uint32_t d : c.deps(i)) succ[fill[d]++] = i;
  std::vector<std::uint32_t> ready, order;
  order.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i)
    if (!waiting[i]) ready.push_back(i);
  while (!ready.empty()) {
    auto it = std::max_element(ready.begin(), ready.end());
    const std::uint32_t i = *it;
    ready.erase(it);
    order.push_back(i);
    for (std::uint32_t k = first[i]; k < first[i + 1]; ++k)
      if (--waiting[succ[k]] == 0) ready.push_back(succ[k]);
  }
  return order;
}

// GRAPHSAFE_HOST_EXECUTION: "synchronous", "seeded" or "seeded:<seed>".
HostExecution execution_from_environment(std::uint64_t& seed) {
  const std::string v = detail::env::host_execution();
  if (v.empty() || v == "synchronous") return HostExecution::synchronous;
  const std::string_view s(v);
  if (s == "seeded") return HostExecution::seeded;
  if (s.starts_with("seeded:") && s.size() > 7) {
    char* end = nullptr;
    const unsigned long long n = std::strtoull(v.c_str() + 7, &end, 0);
    if (end && *end == '\0') {
      seed = n;
      return HostExecution::seeded;
    }
  }
  throw invalid_argument_error("graphsafe: GRAPHSAFE_HOST_EXECUTION='" + std::string(s) +
                               "' is not 'synchronous', 'seeded' or 'seeded:<unsigned seed>'");
}
}  // namespace

HostBackend::HostBackend(HostBackendOptions o) : opts_(o) {
  if (opts_.execution == HostExecution::environment) opts_.execution = execution_from_environment(opts_.seed);
  if (opts_.execution == HostExecution::seeded) {
    sched_ = std::make_unique<detail::HostScheduler>(opts_.seed, opts_.max_queued);
    if (opts_.default_stream) (void)host(Stream(static_cast<cudaStream_t>(nullptr)));
  }
}

HostBackend::~HostBackend() {
  if (!sched_) return;
  std::lock_guard g(sched_->m);
  sched_->drain_all();
  for (auto& st : sched_->streams)
    if (st.owner) st.owner->backend_ = nullptr;
  if (!sched_->races.empty()) {
    // Nobody looked at them (take_races): fail the program, as a sanitizer does.
    for (const HostRace& r : sched_->races) std::fprintf(stderr, "%s\n", r.describe().c_str());
    std::fprintf(stderr, "graphsafe: %zu unordered access(es) found by the host backend's race checker\n",
                 sched_->races.size());
    std::abort();
  }
}

HostStream& HostBackend::host(Stream s) const {
  HostStream* h = static_cast<HostStream*>(s.handle());
  if (!h) {
    if (!opts_.default_stream)
      throw invalid_argument_error("graphsafe: the host backend got a null stream; pass a graphsafe::HostStream "
                                   "(or set HostBackendOptions::default_stream to model CUDA's default stream)");
    h = const_cast<HostStream*>(&default_stream_);
  }
  if (sched_ && h->backend_ != this) [[unlikely]] {
    std::lock_guard g(sched_->m);
    if (h->backend_ && h->backend_ != this)
      throw invalid_argument_error("graphsafe: a host stream bound to one seeded HostBackend was passed to another; "
                                   "give each backend its own streams");
    if (!h->backend_) {
      h->id_ = sched_->add_stream(h);
      h->backend_ = const_cast<HostBackend*>(this);
    }
  }
  return *h;
}

void* HostBackend::allocate_slab(std::uint64_t bytes, Stream s) {
  HostStream* h = sched_ ? &host(s) : nullptr;  // a bad stream is refused before anything is claimed
  // Claim the bytes against the limit first (atomically: concurrent growth must not overshoot it).
  std::uint64_t used = in_use_.load();
  do {
    if (opts_.limit_bytes && (bytes > opts_.limit_bytes || used > opts_.limit_bytes - bytes))
      throw out_of_memory_error("graphsafe: host backend cannot allocate a slab of " + std::to_string(bytes) +
                                " bytes: " + std::to_string(used) + " of its " + std::to_string(opts_.limit_bytes) +
                                "-byte limit are in use; reserve less or raise HostBackendOptions::limit_bytes");
  } while (!in_use_.compare_exchange_weak(used, used + bytes));
  const std::uint64_t rounded = (bytes + 4095) / 4096 * 4096;
  void* p = rounded >= bytes ? std::aligned_alloc(4096, rounded) : nullptr;
  if (!p) {
    in_use_ -= bytes;
    throw out_of_memory_error("graphsafe: host allocation of " + std::to_string(bytes) + " bytes failed");
  }
  std::memset(p, 0xA5, rounded);  // never hand out zeros: they hide unwritten memory in tests
  ++slab_allocations_;
  if (h) {
    // Stream-ordered, as cudaMallocAsync: the slab is ready in `s`'s order (its first write).
    std::lock_guard g(sched_->m);
    sched_->stamp(h->id_, {HostAccess::writes(p, bytes)}, "allocate_slab(" + std::to_string(bytes) + " bytes)");
  }
  return p;
}

void HostBackend::free_slab(void* p, std::uint64_t bytes, Stream s) {
  in_use_ -= bytes;
  if (!sched_) {
    std::free(p);
    return;
  }
  std::lock_guard g(sched_->m);
  auto& sc = *sched_;
  const auto b = reinterpret_cast<std::uintptr_t>(p);
  if (!s.handle()) {
    // The arena's teardown: after all work on every stream, as CudaBackend waits for the device.
    sc.drain_all();
    for (auto& st : sc.streams) detail::HostScheduler::join(sc.host, st.clock);
    sc.forget(b, b + bytes);
    std::free(p);
    return;
  }
  // Stream-ordered, as cudaFreeAsync: a last write of the slab on `s`; its bytes leave the checker
  // (and the process) when the stream gets there.
  HostStream& h = host(s);
  sc.enqueue(h.id_, {[&sc, p, b, bytes] {
                       sc.forget(b, b + bytes);
                       std::free(p);
                     },
                     {HostAccess::writes(p, bytes)},
                     "free_slab(" + std::to_string(bytes) + " bytes)"});
}

CaptureInfo HostBackend::capture_info(Stream s) const {
  const HostStream& h = host(s);
  return {h.capture_id_ != 0, h.capture_id_, false};
}

void HostBackend::begin_capture(Stream s, CaptureMode) {
  HostStream& h = host(s);
  if (h.capture_id_)
    throw capture_state_error("graphsafe: host stream is already capturing (capture id " + std::to_string(h.capture_id_) +
                              "); end that capture first");
  h.capture_ = std::make_shared<detail::HostCapture>();
  h.capture_id_ = h.capture_->id = next_capture_id.fetch_add(1);
  h.capture_->origin = &h;
  h.deps_.clear();
}

GraphHandle HostBackend::end_capture(Stream s) {
  HostStream& h = host(s);
  if (!h.capture_id_) throw capture_state_error("graphsafe: end_capture on a host stream that is not capturing");
  if (h.capture_->origin != &h)
    throw capture_state_error("graphsafe: end_capture on a host stream that joined capture " +
                              std::to_string(h.capture_id_) + " through an event; end it on the stream that began it");
  const auto keep = h.capture_;  // abort_capture below detaches the streams
  detail::HostCapture& c = *keep;
  // Every stream that joined must be joined back (cudaErrorStreamCaptureUnjoined): its last work
  // must be ordered before the origin's end.
  std::size_t unjoined = 0;
  for (HostStream* j : c.joined)
    if (!c.reaches(h.deps_, j->deps_)) ++unjoined;
  if (unjoined) {
    abort_capture(s);
    throw capture_state_error("graphsafe: host capture " + std::to_string(c.id) + " ended with " +
                              std::to_string(unjoined) +
                              " forked stream(s) not joined back into the stream that began it (record an event on "
                              "each and wait on it from the origin stream before ending); the capture is discarded");
  }
  auto* g = new HostGraph;
  const std::vector<std::uint32_t> order = replay_order(c);
  bool in_capture_order = true;  // a single stream's capture: the nodes move over as one vector
  for (std::uint32_t k = 0; k < order.size() && in_capture_order; ++k) in_capture_order = order[k] == k;
  if (in_capture_order) {
    g->work = std::move(c.nodes);
  } else {
    g->work.reserve(order.size());
    for (std::uint32_t i : order) g->work.push_back(std::move(c.nodes[i]));
  }
  g->dep_first = std::move(c.dep_first);
  g->dep_list = std::move(c.dep_list);
  abort_capture(s);  // detaches the streams; the nodes' work has moved to the graph
  return {g, g};
}

void HostBackend::abort_capture(Stream s) noexcept {
  HostStream& h = s.handle() ? *static_cast<HostStream*>(s.handle()) : default_stream_;
  if (!h.capture_) return;
  auto c = h.capture_;  // keeps the capture alive while its streams leave it
  for (HostStream* j : c->joined) {
    if (j->capture_ != c) continue;
    j->capture_.reset();
    j->capture_id_ = 0;
    j->deps_.clear();
  }
  if (c->origin) {
    c->origin->capture_.reset();
    c->origin->capture_id_ = 0;
    c->origin->deps_.clear();
  }
  h.capture_.reset();
  h.capture_id_ = 0;
  h.deps_.clear();
  c->origin = nullptr;  // events recorded in it can no longer be waited on
  c->joined.clear();
}

bool HostBackend::capture_dependencies(Stream s, std::vector<const void*>& out) const {
  const HostStream& h = host(s);
  if (!h.capture_) return false;
  out.clear();
  // Node handles: index + 1, so node 0 is not a null pointer.
  for (std::uint32_t n : h.deps_) out.push_back(reinterpret_cast<const void*>(static_cast<std::uintptr_t>(n) + 1));
  return true;
}

bool HostBackend::capture_ordered_after(Stream s, const std::vector<const void*>& before) const {
  const HostStream& h = host(s);
  if (before.empty()) return true;
  if (!h.capture_) return false;
  std::vector<std::uint32_t> targets;
  for (const void* p : before) targets.push_back(static_cast<std::uint32_t>(reinterpret_cast<std::uintptr_t>(p) - 1));
  for (std::uint32_t t : targets)
    if (t >= h.capture_->nodes.size()) return false;  // a node of another capture: unproven
  return h.capture_->reaches(h.deps_, std::move(targets));
}

bool HostBackend::graph_topology(const GraphHandle& g, GraphTopology& out) const {
  const auto* graph = static_cast<const HostGraph*>(g.exec);
  if (!graph) return false;
  // Node handles as capture_dependencies gives them: index + 1.
  auto handle = [](std::uint32_t n) { return reinterpret_cast<const void*>(static_cast<std::uintptr_t>(n) + 1); };
  out.nodes.clear();
  out.edges.clear();
  for (std::uint32_t n = 0; n + 1 < graph->dep_first.size(); ++n) {
    out.nodes.push_back(handle(n));
    for (std::uint32_t k = graph->dep_first[n]; k < graph->dep_first[n + 1]; ++k)
      out.edges.emplace_back(handle(graph->dep_list[k]), handle(n));
  }
  return true;
}

void HostBackend::launch(const GraphHandle& g, Stream s) {
  HostStream& h = host(s);
  auto* graph = static_cast<HostGraph*>(g.exec);
  if (h.capture_) {
    std::vector<HostAccess> touches;
    for (const HostWork& w : graph->work) touches.insert(touches.end(), w.touches.begin(), w.touches.end());
    h.launch([graph] {
      for (auto& w : graph->work) w.run();
    }, std::move(touches));
    return;
  }
  if (sched_) {
    // The recorded work, in order, on the launch stream; each piece checked with its own ranges.
    std::lock_guard lk(sched_->m);
    for (const HostWork& w : graph->work) sched_->enqueue(h.id_, {w.run, w.touches, "graph replay of " + w.site});
    return;
  }
  for (auto& w : graph->work) w.run();
}

void HostBackend::destroy(GraphHandle& g) noexcept {
  delete static_cast<HostGraph*>(g.exec);
  g = {};
}

void HostBackend::order_after(Stream waiter, Stream producer) {
  if (!sched_) return;  // synchronous streams are always in order
  HostStream& w = host(waiter);
  HostStream& p = host(producer);
  if (&w == &p) return;
  std::lock_guard g(sched_->m);
  auto& sc = *sched_;
  // Event record on `producer` + wait on `waiter`: later work on `waiter` follows all work so far.
  detail::HostScheduler::join(sc.streams[w.id_].clock, sc.streams[p.id_].clock);
  if (sc.streams[p.id_].done < sc.streams[p.id_].enqueued)
    sc.streams[w.id_].queue.push_back({{}, true, p.id_, sc.streams[p.id_].enqueued});
}

void HostBackend::synchronize(Stream s) {
  if (!sched_) return;
  HostStream& h = host(s);
  std::lock_guard g(sched_->m);
  sched_->drain(h.id_);
  detail::HostScheduler::join(sched_->host, sched_->streams[h.id_].clock);
}

void HostBackend::quiesce() {
  if (!sched_) return;
  std::lock_guard g(sched_->m);
  sched_->drain_all();
}

std::vector<HostRace> HostBackend::take_races() {
  if (!sched_) return {};
  std::lock_guard g(sched_->m);
  return std::exchange(sched_->races, {});
}

}  // namespace graphsafe

namespace graphsafe {

// Stream-ordered (debug mode's canaries and audits): queued like any work in seeded mode.
void HostBackend::fill_bytes(void* p, std::uint64_t bytes, std::uint8_t value, Stream s) {
  if (!bytes) return;
  if (!sched_) {
    std::memset(p, value, bytes);
    return;
  }
  HostStream& h = host(s);
  std::lock_guard g(sched_->m);
  sched_->enqueue(h.id_, {[p, bytes, value] { std::memset(p, value, bytes); },
                          {HostAccess::writes(p, bytes)},
                          "fill_bytes(" + std::to_string(bytes) + " bytes)"});
}

void HostBackend::copy_to_host(void* dst, const void* src, std::uint64_t bytes, Stream s) {
  if (!bytes) return;
  if (!sched_) {
    std::memcpy(dst, src, bytes);
    return;
  }
  HostStream& h = host(s);
  std::lock_guard g(sched_->m);
  sched_->enqueue(h.id_, {[dst, src, bytes] { std::memcpy(dst, src, bytes); },
                          {HostAccess::reads(src, bytes)},
                          "copy_to_host(" + std::to_string(bytes) + " bytes)"});
}

}  // namespace graphsafe
