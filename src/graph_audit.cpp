#include "graph_audit.hpp"

#include "arena_core.hpp"

#include <graphsafe/backend.hpp>
#include <graphsafe/debug.hpp>

#include <algorithm>
#include <cstdio>
#include <mutex>
#include <unordered_map>

namespace graphsafe::detail {

namespace {

std::string hex(const void* p) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", p);
  return buf;
}

std::string range(std::uint64_t begin, std::uint64_t end) {
  // Appended piece by piece: GCC 12 reports a false -Wrestrict on "[" + std::string&&.
  std::string out = "[";
  out += std::to_string(begin);
  out += ", ";
  out += std::to_string(end);
  out += ')';
  return out;
}

// Pairs (earlier, later) of spans whose ranges overlap: a sweep in offset order keeps the spans
// still open, so the work is the number of pairs, not the square of the spans.
std::vector<std::pair<std::size_t, std::size_t>> overlapping_pairs(const std::vector<AuditSpan>& spans) {
  std::vector<std::size_t> order;
  for (std::size_t i = 0; i < spans.size(); ++i)
    if (spans[i].bytes) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    return spans[a].offset != spans[b].offset ? spans[a].offset < spans[b].offset : a < b;
  });
  std::vector<std::pair<std::size_t, std::size_t>> pairs;
  std::vector<std::size_t> open;
  for (std::size_t i : order) {
    const std::uint64_t begin = spans[i].offset;
    std::erase_if(open, [&](std::size_t j) { return spans[j].offset + spans[j].bytes <= begin; });
    for (std::size_t j : open) pairs.emplace_back(std::min(i, j), std::max(i, j));
    open.push_back(i);
  }
  std::sort(pairs.begin(), pairs.end(), [](const auto& x, const auto& y) {
    return x.second != y.second ? x.second < y.second : x.first < y.first;
  });
  return pairs;
}

}  // namespace

std::vector<AuditViolation> audit_reuse(const GraphTopology& graph, const std::vector<AuditSpan>& spans) {
  std::vector<AuditViolation> out;
  const auto pairs = overlapping_pairs(spans);
  if (pairs.empty()) return out;

  std::unordered_map<const void*, std::uint32_t> index;
  index.reserve(graph.nodes.size());
  for (const void* n : graph.nodes) index.emplace(n, static_cast<std::uint32_t>(index.size()));
  std::vector<std::vector<std::uint32_t>> preds(index.size());
  for (auto [from, to] : graph.edges) {
    auto f = index.find(from), t = index.find(to);
    if (f != index.end() && t != index.end()) preds[t->second].push_back(f->second);
  }
  // mark[n] == stamp: n is one of the later request's dependencies or an ancestor of one.
  std::vector<std::uint32_t> mark(index.size(), 0);
  std::uint32_t stamp = 0;
  std::vector<std::uint32_t> stack;
  std::size_t marked_for = spans.size();

  for (auto [a, b] : pairs) {
    const AuditSpan& e = spans[a];
    const AuditSpan& l = spans[b];
    std::string why;
    if (!e.released) {
      why = "'" + e.name + "' is never released during the capture, so both are live at once";
    } else if (!e.release_known || !l.request_known) {
      if (e.release_stream != l.stream)
        why = "the backend gave no capture position for " +
              std::string(!e.release_known ? "the release of '" + e.name + "'" : "the request of '" + l.name + "'") +
              " and the two are on different streams (" + hex(e.release_stream) + ", " + hex(l.stream) + ")";
    } else {
      if (marked_for != b) {
        ++stamp;
        marked_for = b;
        for (const void* n : l.requested_after)
          if (auto it = index.find(n); it != index.end()) stack.push_back(it->second);
        while (!stack.empty()) {
          const std::uint32_t n = stack.back();
          stack.pop_back();
          if (mark[n] == stamp) continue;
          mark[n] = stamp;
          for (std::uint32_t p : preds[n])
            if (mark[p] != stamp) stack.push_back(p);
        }
      }
      std::size_t missing = 0, unordered = 0;
      for (const void* n : e.released_after) {
        auto it = index.find(n);
        if (it == index.end())
          ++missing;
        else if (mark[it->second] != stamp)
          ++unordered;
      }
      if (missing || unordered)
        why = std::to_string(unordered + missing) + " of the " + std::to_string(e.released_after.size()) +
              " node(s) the release of '" + e.name + "' follows (stream " + hex(e.release_stream) + ") " +
              (missing ? "are not in the graph or " : "") + "are not ordered before the request of '" + l.name +
              "' (stream " + hex(l.stream) + ")";
    }
    if (why.empty()) continue;
    const std::uint64_t lo = std::max(e.offset, l.offset);
    const std::uint64_t hi = std::min(e.offset + e.bytes, l.offset + l.bytes);
    AuditViolation v;
    v.earlier = a;
    v.later = b;
    v.message = "workspaces '" + e.name + "' (requested at " + e.site + ", bytes " + range(e.offset, e.offset + e.bytes) +
                ") and '" + l.name + "' (requested at " + l.site + ", bytes " + range(l.offset, l.offset + l.bytes) +
                ") share bytes " + range(lo, hi) + " of the region, but the graph does not order every use of '" +
                e.name + "' before every use of '" + l.name + "': " + why;
    out.push_back(std::move(v));
  }
  return out;
}

std::size_t audit_captured_graph(SessionState& st, const GraphHandle& h) {
  GraphTopology topo;
  if (!st.core->backend.graph_topology(h, topo)) return 0;
  std::vector<AuditSpan> spans;
  {
    const CapturePlanner* planner = st.placement->planner();
    if (!planner) return 0;  // ranges never reused: nothing shares bytes
    std::lock_guard g(st.placement->mutex());
    const auto& entries = st.plan.entries();
    const auto& blocks = planner->blocks();
    for (std::size_t i = 0; i < blocks.size(); ++i) {
      const PlannedBlock& b = blocks[i];
      AuditSpan s;
      const PlanEntry* e = b.entry < entries.size() ? &entries[b.entry] : nullptr;
      s.name = e ? e->name : planner->name(i);
      s.site = e ? e->site : std::string("?");
      s.offset = b.offset;
      s.bytes = b.bytes;
      s.stream = b.stream;
      s.request_known = b.request_known;
      const auto requested = planner->position(b.request_position);
      s.requested_after.assign(requested.begin(), requested.end());
      s.released = b.released;
      s.release_stream = b.release_stream;
      s.release_known = b.position_known;
      const auto released = planner->position(b.release_position);
      s.released_after.assign(released.begin(), released.end());
      spans.push_back(std::move(s));
    }
  }
  const auto violations = audit_reuse(topo, spans);
  for (const AuditViolation& v : violations) {
    const AuditSpan& l = spans[v.later];
    debug::report_finding(debug::kind::unordered_reuse, l.site, v.message,
                          "make the later request's stream wait on an event recorded after the earlier workspace's "
                          "release (a join); if the capture did join them, the reuse was placed without that proof",
                          l.name, "family '" + st.family->name + "' (capture)");
  }
  return violations.size();
}

}  // namespace graphsafe::detail
