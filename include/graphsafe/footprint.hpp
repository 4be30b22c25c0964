// Footprint: which elements of a workspace a step actually touches, as a function of the bindings.
//
// Only the virtual-growth mode reads it (ArenaOptions::virtual_memory, docs/virtual_growth.md): a
// captured workspace is reserved at its policy's bound as address space, and physical memory is
// mapped only behind the footprint. Without a footprint a request's footprint is its whole need
// (a prefix of `need` elements). The touched part is not always a prefix: DS4's gather workspace in
// its strided layout [R, M, 512] touches, for each request b, rows [b*M, b*M + n_c(b)) and
// [b*M + N, b*M + N + G(b)) (its ragged layout, GatherDecode's default in virtual mode, touches one
// prefix: Footprint::prefix(sum_over(L, n_c(l) + G(l)) * 512)):
//
//   Footprint::per_request_ranges(seq_lens, M * 512, [&](const Extent& l) {
//     return std::vector<FootprintRange>{{0, floor_div(l, 4) * 512},            // compressed rows
//                                        {N * 512, min(l, Extent(W)) * 512}};   // SWA rows
//   });
//
// Rules (checked when the footprint is made; invalid_argument_error otherwise): offsets and the
// stride are static (constants or static symbols); a per-request length depends only on `l` (the
// request's value batch[b]) and static symbols, and is monotone in it (no dynamic divisor), so a
// replay whose values are all <= the values the mapped memory was checked for needs nothing new --
// the replay path's fast check is one compare per request.
#pragma once

#include <graphsafe/extent.hpp>
#include <graphsafe/symbol.hpp>

#include <functional>
#include <memory>
#include <optional>
#include <vector>

namespace graphsafe {

// Elements [offset, offset + length) (relative to the workspace, or to a batch element's start).
struct FootprintRange {
  Extent offset;
  Extent length;
};

class Footprint {
 public:
  enum class Kind : std::uint8_t { whole, prefix, per_request };

  // The request's whole need (the default).
  Footprint() = default;
  static Footprint whole() { return Footprint(); }
  // Elements [0, length). `length` may depend on any symbol; it is evaluated at every replay.
  static Footprint prefix(Extent length);
  // For each element b of `batch`: elements [b * stride, b * stride + length(batch[b])).
  static Footprint per_request(Symbol batch, Extent stride, const std::function<Extent(const Extent& l)>& length);
  // For each element b of `batch`: the ranges ranges(batch[b]), each offset by b * stride.
  static Footprint per_request_ranges(Symbol batch, Extent stride,
                                      const std::function<std::vector<FootprintRange>(const Extent& l)>& ranges);

  Kind kind() const { return kind_; }
  // prefix: the length.
  const std::optional<Extent>& length() const { return length_; }
  // per_request: the batch symbol, the stride, the ranges written in element_symbol(), which
  // stands for batch[b] (a dynamic scalar symbol without capacity, one per batch symbol).
  std::optional<Symbol> batch() const { return batch_; }
  std::optional<Symbol> element_symbol() const { return element_; }
  const std::optional<Extent>& stride() const { return stride_; }
  const std::vector<FootprintRange>& ranges() const { return ranges_; }

 private:
  Kind kind_ = Kind::whole;
  std::optional<Extent> length_;
  std::optional<Symbol> batch_;
  std::optional<Symbol> element_;
  std::optional<Extent> stride_;
  std::vector<FootprintRange> ranges_;
};

}  // namespace graphsafe
