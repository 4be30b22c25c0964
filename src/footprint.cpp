#include <graphsafe/error.hpp>
#include <graphsafe/footprint.hpp>

#include <mutex>
#include <unordered_map>

namespace graphsafe {

namespace {

// One placeholder symbol per batch symbol ("seq_lens[b]"), made once: footprints are built at every
// capture and must not grow the symbol registry each time.
Symbol element_of(Symbol batch) {
  static std::mutex m;
  static std::unordered_map<std::uint32_t, std::uint32_t> ids;
  std::lock_guard g(m);
  if (auto it = ids.find(batch.id()); it != ids.end()) return Symbol::from_id(it->second);
  const Symbol e = Symbol::dynamic(batch.name() + "[b]");
  ids.emplace(batch.id(), e.id());
  return e;
}

void require_static(const Extent& e, const char* what) {
  if (!e.is_static())
    throw invalid_argument_error(std::string("graphsafe: footprint ") + what + " " + e.to_string() +
                                 " depends on a dynamic symbol; offsets and strides must be static (constants, "
                                 "static symbols or sized dimensions) so the addresses a graph touches are fixed");
}

void check_length(const Extent& len, Symbol elem, Symbol batch) {
  for (Symbol s : len.dynamic_symbols())
    if (!(s == elem))
      throw invalid_argument_error("graphsafe: per-request footprint length " + len.to_string() + " depends on " +
                                   s.name() + "; a request's footprint may depend only on its own value " +
                                   batch.name() + "[b] and static symbols");
  if (!len.monotone())
    throw invalid_argument_error("graphsafe: per-request footprint length " + len.to_string() +
                                 " is not monotone in " + batch.name() +
                                 "[b] (a divisor depends on it); the replay path relies on 'more length, more memory'");
}

Footprint make(Symbol batch, const Extent& stride) {
  if (batch.kind() != SymbolKind::batch)
    throw invalid_argument_error("graphsafe: per-request footprint over " + batch.name() +
                                 ", which is not a batch symbol (Symbol::batch)");
  require_static(stride, "stride");
  return Footprint();
}

}  // namespace

Footprint Footprint::prefix(Extent length) {
  Footprint f;
  f.kind_ = Kind::prefix;
  f.length_ = std::move(length);
  return f;
}

Footprint Footprint::per_request(Symbol batch, Extent stride, const std::function<Extent(const Extent& l)>& length) {
  return per_request_ranges(batch, std::move(stride), [&](const Extent& l) {
    return std::vector<FootprintRange>{{Extent(0), length(l)}};
  });
}

Footprint Footprint::per_request_ranges(Symbol batch, Extent stride,
                                        const std::function<std::vector<FootprintRange>(const Extent& l)>& ranges) {
  Footprint f = make(batch, stride);
  f.kind_ = Kind::per_request;
  f.batch_ = batch;
  const Symbol elem = element_of(batch);
  f.element_ = elem;
  f.stride_ = std::move(stride);
  f.ranges_ = ranges(Extent(elem));
  for (const FootprintRange& r : f.ranges_) {
    require_static(r.offset, "offset");
    check_length(r.length, elem, batch);
  }
  return f;
}

}  // namespace graphsafe
