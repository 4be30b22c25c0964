#include <graphsafe/error.hpp>
#include <graphsafe/host_backend.hpp>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

namespace graphsafe {

Stream::Stream(HostStream& s) : handle_(static_cast<void*>(&s)) {}

namespace detail {
// A capture under way: nodes with their dependencies, the streams that joined it.
struct HostCapture {
  struct Node {
    std::function<void()> work;
    std::vector<std::uint32_t> deps;
  };
  std::uint64_t id = 0;
  HostStream* origin = nullptr;
  std::vector<Node> nodes;
  std::vector<HostStream*> joined;  // streams that joined through an event (the origin excluded)

  std::uint32_t add(std::function<void()> work, std::vector<std::uint32_t> deps) {
    nodes.push_back({std::move(work), std::move(deps)});
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
      for (std::uint32_t d : nodes[n].deps) stack.push_back(d);
    }
    return targets.empty();
  }
};
}  // namespace detail

HostStream::~HostStream() {
  if (capture_ && capture_->origin != this) std::erase(capture_->joined, this);
  if (capture_ && capture_->origin == this) capture_->origin = nullptr;
}

void HostStream::launch(std::function<void()> work) {
  if (capture_) {
    const std::uint32_t n = capture_->add(std::move(work), std::move(deps_));
    deps_.assign(1, n);
  } else {
    work();
  }
}

void HostStream::record(HostEvent& e) {
  e.capture_ = capture_;
  e.capture_id_ = capture_id_;
  e.nodes_ = capture_ ? deps_ : std::vector<std::uint32_t>{};
}

void HostStream::wait(const HostEvent& e) {
  if (!e.capture_) return;  // eager: the recorded work already ran
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
HostStream& host(Stream s) {
  if (!s.handle())
    throw invalid_argument_error("graphsafe: the host backend got a null stream; pass a graphsafe::HostStream");
  return *static_cast<HostStream*>(s.handle());
}
std::atomic<std::uint64_t> next_capture_id{1};
// An instantiated host graph: the capture's nodes in one topological order.
struct HostGraph {
  std::vector<std::function<void()>> work;
};

// Kahn's algorithm taking the most recently captured ready node first: concurrent branches run in
// an order other than capture order, so work that lacks a dependency runs too early and shows.
std::vector<std::uint32_t> replay_order(const detail::HostCapture& c) {
  const std::size_t n = c.nodes.size();
  std::vector<std::uint32_t> waiting(n, 0);
  std::vector<std::vector<std::uint32_t>> succ(n);
  for (std::uint32_t i = 0; i < n; ++i)
    for (std::uint32_t d : c.nodes[i].deps) {
      ++waiting[i];
      succ[d].push_back(i);
    }
  std::vector<std::uint32_t> ready, order;
  for (std::uint32_t i = 0; i < n; ++i)
    if (!waiting[i]) ready.push_back(i);
  while (!ready.empty()) {
    auto it = std::max_element(ready.begin(), ready.end());
    const std::uint32_t i = *it;
    ready.erase(it);
    order.push_back(i);
    for (std::uint32_t s : succ[i])
      if (--waiting[s] == 0) ready.push_back(s);
  }
  return order;
}

}  // namespace

void* HostBackend::allocate_slab(std::uint64_t bytes, Stream) {
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
  return p;
}

void HostBackend::free_slab(void* p, std::uint64_t bytes, Stream) {
  std::free(p);
  in_use_ -= bytes;
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
  for (std::uint32_t i : replay_order(c)) g->work.push_back(std::move(c.nodes[i].work));
  abort_capture(s);  // detaches the streams; the nodes' work has moved to the graph
  return {g, g};
}

void HostBackend::abort_capture(Stream s) noexcept {
  HostStream& h = *static_cast<HostStream*>(s.handle());
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

void HostBackend::launch(const GraphHandle& g, Stream s) {
  HostStream& h = host(s);
  auto* graph = static_cast<HostGraph*>(g.exec);
  if (h.capture_) {
    h.launch([graph] {
      for (auto& w : graph->work) w();
    });
    return;
  }
  for (auto& w : graph->work) w();
}

void HostBackend::destroy(GraphHandle& g) noexcept {
  delete static_cast<HostGraph*>(g.exec);
  g = {};
}

}  // namespace graphsafe

namespace graphsafe {

// Host streams run eagerly (debug operations happen outside capture), so these are immediate.
void HostBackend::fill_bytes(void* p, std::uint64_t bytes, std::uint8_t value, Stream) {
  if (bytes) std::memset(p, value, bytes);
}

void HostBackend::copy_to_host(void* dst, const void* src, std::uint64_t bytes, Stream) {
  if (bytes) std::memcpy(dst, src, bytes);
}

}  // namespace graphsafe
