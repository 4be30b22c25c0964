// Errors are types: each says what went wrong, names the value and the limit, and what to do next.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace graphsafe {

// Base of everything graphsafe throws.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// A caller passed a value outside its contract (negative length, zero alignment, ...).
class invalid_argument_error : public error {
 public:
  using error::error;
};

// A symbol was bound to a value above its declared capacity.
class capacity_error : public invalid_argument_error {
 public:
  using invalid_argument_error::invalid_argument_error;
};

// An extent referenced a symbol that the bindings do not define.
class unbound_symbol_error : public invalid_argument_error {
 public:
  using invalid_argument_error::invalid_argument_error;
};

// A size or byte count does not fit in 64 bits.
class overflow_error : public error {
 public:
  using error::error;
};

// A sizing policy cannot give a replay-safe size for a request (e.g. a dynamic symbol with no
// capacity under capacity_bound); the message names the symbol and suggests the fix.
class policy_refusal : public error {
 public:
  using error::error;
};

// A call made in the wrong capture state (reserve during capture, request on a stream captured
// outside graphsafe, replay while capturing, ...).
class capture_state_error : public error {
 public:
  using error::error;
};

// The arena (or its upstream) cannot provide the bytes asked for.
class out_of_memory_error : public error {
 public:
  using error::error;
};

// A CUDA call failed; the message carries the call, the CUDA error name and string.
class cuda_error : public error {
 public:
  cuda_error(const std::string& what, int code) : error(what), code_(code) {}
  int code() const noexcept { return code_; }

 private:
  int code_;
};

// One guard that does not hold for a replay's bindings: `required` elements are needed but the graph
// reserved `reserved` for request `request`.
struct GuardViolation {
  std::string request;        // name of the recorded request (or dimension)
  std::string policy;         // policy that sized it at capture
  std::string site;           // file:line of the request
  std::int64_t required = 0;  // need under the replay's bindings
  std::int64_t reserved = 0;  // what the capture reserved
  std::string symbols;        // "seq_lens = [15, 17] (captured [3, 5], capacity 512)"
};

// A replay whose bindings need more than the captured graph reserved. Thrown before launch: the
// graph never ran with these bindings.
class guard_failure : public error {
 public:
  guard_failure(const std::string& what, std::vector<GuardViolation> v)
      : error(what), violations_(std::move(v)) {}
  const std::vector<GuardViolation>& violations() const noexcept { return violations_; }

 private:
  std::vector<GuardViolation> violations_;
};

// Ranks whose captured layouts differ (check_identical_layouts, graphsafe/plan_layout.hpp): what
// differs first between rank 0 and `rank`. For a request, both ranks' request at `request`; when
// one rank has fewer requests, its side is empty (name "", offset and bytes 0).
struct LayoutMismatch {
  enum class Field : std::uint8_t {
    name, kind, offset, bytes, physical_offset, alignment,  // of request `request`
    request_count, region_bytes, physical_bytes,
    graph_count,  // ranks captured different numbers of graphs (per-rank graph lists)
  };
  static constexpr std::size_t kNone = ~std::size_t(0);
  Field field = Field::name;
  std::size_t rank = 0;            // first rank that differs from rank 0
  std::size_t graph = kNone;       // per-rank graph lists: the graph, in capture order
  std::size_t request = kNone;     // index in capture order (request_count: the first extra one)
  std::string name0, name_r;           // the request on rank 0 and on `rank`
  std::string site0, site_r;
  std::uint64_t offset0 = 0, offset_r = 0;
  std::uint64_t bytes0 = 0, bytes_r = 0;
  std::uint64_t value0 = 0, value_r = 0;  // the differing field's values (counts, sizes, ...)
};

class layout_mismatch_error : public error {
 public:
  layout_mismatch_error(const std::string& what, LayoutMismatch m) : error(what), mismatch_(std::move(m)) {}
  const LayoutMismatch& mismatch() const noexcept { return mismatch_; }

 private:
  LayoutMismatch mismatch_;
};

}  // namespace graphsafe
