// Graph audit (debug mode): after a capture is instantiated, prove from the graph itself that every
// two workspaces sharing bytes are ordered, every use of the earlier before every use of the later.
//
// The planner reuses a released range only when the backend says the capture orders the release
// before the new request; the audit checks the result independently, on the instantiated graph's
// nodes and edges (Backend::graph_topology), so a wrong ordering answer, a placement followed from
// an earlier layout, or any later change to placement cannot hand one workspace's bytes to another
// that runs concurrently with it without a finding.
//
// What a workspace's uses are: the work captured on its stream after the request, and work forked
// from there. Each such node descends from every node of the requesting stream's capture
// dependencies at the request (a stream's dependencies only move forward). Work that used the
// earlier workspace is ordered before its release on the releasing stream (the arena's contract for
// any release). So the earlier is ordered before the later when every node of the releasing
// stream's dependencies at release is the later request's dependency or an ancestor of one.
//
// Cost: the overlapping pairs come from a sweep over offsets; one backward walk over the graph per
// workspace that shares bytes with an earlier one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace graphsafe {
struct GraphHandle;
struct GraphTopology;
}  // namespace graphsafe

namespace graphsafe::detail {

struct SessionState;

// One workspace of a capture, in request order.
struct AuditSpan {
  std::string name;
  std::string site;
  std::uint64_t offset = 0;
  std::uint64_t bytes = 0;  // range taken (guard included)
  void* stream = nullptr;   // requested on
  bool request_known = false;
  std::vector<const void*> requested_after;  // the requesting stream's capture dependencies at the request
  bool released = false;                      // released during the capture
  void* release_stream = nullptr;
  bool release_known = false;
  std::vector<const void*> released_after;  // the releasing stream's capture dependencies at release
};

struct AuditViolation {
  std::size_t earlier = 0;  // indices into the spans, earlier < later
  std::size_t later = 0;
  std::string message;  // names both workspaces, their sites and the shared bytes
};

// Every pair of spans whose ranges overlap and that `graph` does not order. A span whose positions
// the backend could not give is ordered only by stream order (same stream); a position node missing
// from the graph proves nothing.
std::vector<AuditViolation> audit_reuse(const GraphTopology& graph, const std::vector<AuditSpan>& spans);

// Debug mode, right after instantiation: audits the capture's workspaces against the graph and
// reports each violation as an unordered-reuse finding. Returns the number of violations (0 also
// when the backend cannot give the graph's topology).
std::size_t audit_captured_graph(SessionState& st, const GraphHandle& h);

}  // namespace graphsafe::detail
