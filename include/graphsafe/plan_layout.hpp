// PlanLayout: where a captured plan put its workspaces, and nothing else -- the record that
// tensor-parallel ranks compare. Every rank runs the same capture; collectives on arena workspaces
// want the same offsets on every rank, and a rank whose capture differed (another size, an extra
// request, another order) must be caught before its graph runs a collective on the wrong bytes.
//
//   auto words = graph.plan().layout().serialize();        // flat uint64 words
//   // all-gather `words` with any communicator (NCCL, MPI, torch.distributed) ...
//   graphsafe::check_identical_layouts(per_rank_layouts);  // throws layout_mismatch_error
//
// The layout holds no addresses and no policy state: only what must agree across ranks.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace graphsafe {

class Plan;

// One workspace or opaque request of the plan, in capture order (sized dimensions hold no bytes and
// are left out).
struct LayoutRequest {
  enum class Kind : std::uint8_t { workspace = 0, opaque = 2 };  // PlanEntry::Kind's values
  Kind kind = Kind::workspace;
  std::string name;
  std::uint64_t offset = 0;           // from the start of the family's region
  std::uint64_t physical_offset = 0;  // offset in the physical layout (differs under virtual sharing)
  std::uint64_t bytes = 0;            // reserved bytes
  std::uint64_t alignment = 0;        // boundary the offset was placed on
  // file:line (function) of the request: reported, never compared or digested (ranks may build
  // the same source from different paths).
  std::string site;

  friend bool operator==(const LayoutRequest&, const LayoutRequest&) = default;
};

struct PlanLayout {
  std::vector<LayoutRequest> requests;
  std::uint64_t region_bytes = 0;    // Plan::bytes()
  std::uint64_t physical_bytes = 0;  // Plan::physical_bytes()

  static PlanLayout of(const Plan& plan);

  // 64-bit FNV-1a digest of everything the ranks must agree on (sites excluded): equal layouts
  // give equal digests, so ranks may all-gather 8 bytes first and the full layout only on a
  // mismatch. Defined as FNV-1a 64 over the little-endian bytes of the 64-bit words
  //   kFormat, request count, region_bytes, physical_bytes,
  //   per request: kind, offset, physical_offset, bytes, alignment, name length,
  // each request's words followed by its name's raw bytes.
  std::uint64_t digest() const;

  // Flat encoding as 64-bit words, the same on every host (sites included), for all-gathers:
  //   kMagic, total words, request count, region_bytes, physical_bytes,
  //   per request: kind, offset, physical_offset, bytes, alignment, name length, site length,
  //   then name and site, 8 characters a word (first character in the low byte), zero-padded.
  std::vector<std::uint64_t> serialize() const;
  // The inverse. Words after the encoded length are ignored, so ranks may pad their buffers to a
  // common size for a fixed-size all-gather. A malformed buffer throws invalid_argument_error
  // naming the word, its value and the limit.
  static PlanLayout deserialize(std::span<const std::uint64_t> words);

  static constexpr std::uint64_t kMagic = 0x31'54'55'4F'59'41'4C'47ull;  // "GLAYOUT1", low byte first
  static constexpr std::uint64_t kFormat = 1;

  friend bool operator==(const PlanLayout&, const PlanLayout&) = default;
};

inline std::uint64_t layout_digest(const PlanLayout& l) { return l.digest(); }

// Throws layout_mismatch_error (graphsafe/error.hpp) naming the first rank whose layout differs
// from rank 0's: its first differing request (index, name, site, offset and bytes on both ranks),
// or else a differing request count, region or physical size. Sites are not compared.
void check_identical_layouts(std::span<const PlanLayout> per_rank);
// The same for ranks that each captured several graphs (a capture family's buckets): per rank, its
// graphs' layouts in capture order. Graph g of every rank is compared with graph g of rank 0; the
// error also names the graph, or a differing graph count.
void check_identical_layouts(std::span<const std::vector<PlanLayout>> per_rank_graphs);

}  // namespace graphsafe
