// Debug mode: learn at capture time every place where a captured graph will go wrong at replay.
//
//   GRAPHSAFE_DEBUG=1 ./engine          (or ArenaOptions{.debug = true})
//   GRAPHSAFE_DEBUG_REPORT=report.json  (JSON report written at exit; or debug::write_report(path))
//
// With ArenaOptions::debug on, the arena
//   * records a finding for every request whose size depends on a dynamic symbol with no replay-safe
//     bound (exact-at-capture under capture) and for every opaque (size_t) request made during capture;
//   * refuses requests on streams captured outside graphsafe (always_check_capture);
//   * reports graphs of one family replayed on different streams;
//   * puts a guard region (canary_bytes, default 256) behind every workspace, fills it with a
//     pattern and checks it after replays (every canary_check_every replays, or check_canaries());
//     an overwrite names the workspace, the graph and the replay;
//   * registers its slabs and workspaces with the NVTX Memory API (CUDA backend), so
//     compute-sanitizer memcheck reports a write past a workspace into the guard behind it;
//   * finds the eager workspaces a captured graph uses by pointer (kernel arguments, copy and
//     memset addresses, pointers declared with captured_pointer) and reports the release of such a
//     workspace while the graph lives: its bytes would be served again and every replay would write
//     into their new owner;
//   * prints each capture's findings on stderr when the capture ends.
// probe() and audit_replay() work with or without debug mode. Off, none of this costs anything but
// one predictable branch per request / replay. See docs/debug_mode.md.
#pragma once

#include <graphsafe/arena.hpp>
#include <graphsafe/bindings.hpp>
#include <graphsafe/captured_graph.hpp>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <source_location>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace graphsafe::debug {

// Kinds of findings graphsafe makes itself. External tools (the CUPTI injection library) use their
// own kind strings, e.g. "raw-cuda-malloc-in-capture".
namespace kind {
inline constexpr std::string_view unbounded_dynamic_size = "unbounded-dynamic-size";      // 1
inline constexpr std::string_view opaque_request_in_capture = "opaque-request-in-capture";  // 2
inline constexpr std::string_view probe_difference = "probe-difference";                   // 4
inline constexpr std::string_view concurrent_family_replay = "concurrent-family-replay";   // 5
inline constexpr std::string_view canary_overwrite = "canary-overwrite";                   // 7
inline constexpr std::string_view replay_mismatch = "replay-mismatch";                     // 9
inline constexpr std::string_view replay_refused = "replay-refused";                       // 9 (guard refused)
inline constexpr std::string_view captured_eager_release = "captured-eager-release";
// A capture request could not reuse a range released earlier in the capture: the graph does not
// order the release before this request's stream (join the streams with an event).
inline constexpr std::string_view reuse_not_proven = "reuse-not-proven";
// Two workspaces of a captured graph share bytes but the instantiated graph does not order every use
// of the earlier before every use of the later (the graph audit at instantiation; names both sites).
inline constexpr std::string_view unordered_reuse = "unordered-reuse";
}  // namespace kind

struct Finding {
  std::string kind;     // one of debug::kind, or an external tool's kind
  std::string request;  // workspace / dimension / kernel the finding is about ("" if none)
  std::string graph;    // "family 'decode' graph #3" ("" if none)
  std::string site;     // file:line (function) of the call that caused it
  std::string message;  // what is wrong, with values
  std::string fix;      // what to do
  std::uint64_t count = 1;  // identical findings are merged and counted
};

// True when GRAPHSAFE_DEBUG is set to something other than "", "0", "false", "off" or "no".
bool env_enabled() noexcept;

// ---- the process-wide report --------------------------------------------------------------------

// Add a finding (thread-safe). Identical findings (same kind, request, graph, site, message) are
// merged into one with a count. The hook for external detectors (CUPTI callbacks): a finding added
// while a capture is under way is printed with that capture's report when it ends.
void report_finding(std::string_view kind, std::string_view site, std::string_view message, std::string_view fix = {},
                    std::string_view request = {}, std::string_view graph = {});
void report_finding(Finding f);

std::vector<Finding> findings();      // a snapshot, in the order first reported
std::size_t finding_count();
void clear_findings();
std::string report_text();            // human-readable, one block per finding
std::string report_json();            // see docs/debug_mode.md for the format
// Write the JSON report to `path`; throws graphsafe::error naming the path if it cannot.
void write_report(const std::string& path);
// GRAPHSAFE_DEBUG_REPORT=path: the JSON report is also written at process exit (if any finding was
// made or debug mode was used).

// ---- eager memory captured by pointer ----------------------------------------------------------

// Declare that the work being captured on `s` uses memory through `p`, for a pointer graphsafe cannot
// read from the graph: an address a host closure captured (HostStream::launch), a pointer stored in
// device memory, kernel arguments passed through `extra`. On the CUDA backend kernel arguments,
// copies and memsets are read from the graph without help. A pointer into an eager workspace of
// `arena` is then held by the graph like a kernel argument: releasing that workspace while the graph
// lives is a captured-eager-release finding naming `what` and this call's site.
//
//   auto table = arena.request(s, "block_table", Extent(R) * 64, sizeof(int), capacity_bound, b);  // eager
//   auto graph = capture(arena, s, b, [&](const Bindings&) {
//     debug::captured_pointer(arena, s, table.data(), "block table");
//     host_stream.launch([p = table.as<int>()] { use(p); });
//   });
//   table.reset();   // finding: 'block_table' released while the graph still uses it
//
// Does nothing when the arena is not in debug mode. In debug mode, throws capture_state_error when `s`
// is not capturing through graphsafe with `arena`.
void captured_pointer(Arena& arena, Stream s, const void* p, std::string_view what = {},
                      std::source_location loc = std::source_location::current());

// ---- canaries -----------------------------------------------------------------------------------

// Check the guard regions behind `graph`'s workspaces now (synchronizes `s`, the stream the graph
// was last replayed on). Returns the overwrites found (also added to the report); empty when intact
// or when the arena is not in debug mode with canaries. Guards are re-armed before the next replay.
std::vector<Finding> check_canaries(CapturedGraph& graph, Stream s);

// ---- probe capture ------------------------------------------------------------------------------

// Capture `fn` twice, with bindings `a` and with bindings `b` (same static values, different dynamic
// ones), in one fresh family so both graphs start at the same address, and report every difference:
// plan entries by order (name, elements, bytes, offset), and on the CUDA backend every kernel node
// whose function, launch shape or argument bytes differ (cudaGraphKernelNodeGetParams +
// cudaFuncGetParamInfo). Anything that differs is frozen at capture from a dynamic value. The
// findings are returned and added to the report. Works with or without debug mode.
std::vector<Finding> probe(Arena& arena, Stream s, const std::function<void(const Bindings&)>& fn, const Bindings& a,
                           const Bindings& b);

// ---- replay audit -------------------------------------------------------------------------------

struct AuditOptions {
  // Called before each run (capture, eager, replay) to put the inputs for these bindings in place
  // (e.g. upload sequence lengths to the device buffer the kernels read).
  std::function<void(const Bindings&)> prepare;
  // Replay with the guards bypassed (replay_unguarded_for_testing): shows what a refused replay
  // would have computed. Default: guarded, a refusal is reported as such.
  bool bypass_guards = false;
  // Byte written over the output before each run, so stale results never compare equal.
  std::uint8_t poison = 0x5A;
};

struct AuditStep {
  std::size_t step = 0;           // index into `later`
  bool equal = false;             // graph output == eager output, byte for byte
  bool refused = false;           // the guard refused the replay (never launched)
  std::uint64_t first_difference = 0;  // byte offset of the first difference (when !equal && !refused)
  std::uint64_t differing_bytes = 0;
  std::string message;
};

// Capture `fn` once with `capture_bindings`; then, for each bindings in `later`, run `fn` eagerly and
// replay the graph on equal inputs and compare `output()` (memory of the arena's backend: device
// memory for CUDA) byte for byte. Mismatches and refusals are added to the report.
std::vector<AuditStep> audit_replay(Arena& arena, Stream s, const std::function<void(const Bindings&)>& fn,
                                    const std::function<std::span<const std::byte>()>& output,
                                    const Bindings& capture_bindings, const std::vector<Bindings>& later,
                                    AuditOptions opts = {});

}  // namespace graphsafe::debug
