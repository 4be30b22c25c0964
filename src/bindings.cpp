#include <graphsafe/bindings.hpp>
#include <graphsafe/error.hpp>

#include <algorithm>

namespace graphsafe {

void detail::bad_batch_length(Symbol batch, std::size_t values, std::int64_t length) {
  throw invalid_argument_error("graphsafe: batch symbol '" + batch.name() + "' has " + std::to_string(values) +
                               " values but its length '" + batch.length().name() + "' is " + std::to_string(length) +
                               "; bind one value per request (pad inactive requests with 0), and bind a changed "
                               "length before its values");
}

void Bindings::check_value(Symbol s, std::int64_t v, std::optional<std::size_t> index) const {
  const std::string where = index ? s.name() + "[" + std::to_string(*index) + "]" : s.name();
  if (v < 0)
    throw invalid_argument_error("graphsafe: " + where + " = " + std::to_string(v) +
                                 " is negative; symbol values are element counts >= 0");
  if (auto cap = s.capacity(); cap && v > *cap)
    throw capacity_error("graphsafe: " + where + " = " + std::to_string(v) + " exceeds its capacity " +
                         std::to_string(*cap) + "; raise the capacity where '" + s.name() +
                         "' is declared (e.g. max_model_len) or reject this input before binding it");
}

Bindings& Bindings::set(Symbol s, std::int64_t value) {
  if (s.kind() == SymbolKind::batch)
    throw invalid_argument_error("graphsafe: '" + s.name() + "' is a batch symbol; bind it to one value per request");
  check_value(s, value, std::nullopt);
  for (auto& e : scalars_)
    if (e.id == s.id()) {
      e.value = value;
      return *this;
    }
  scalars_.push_back({s.id(), value});
  return *this;
}

Bindings::Vector& Bindings::vector_slot(std::uint32_t id) {
  for (auto& e : vectors_)
    if (e.id == id) return e;
  vectors_.push_back({id, {}});
  return vectors_.back();
}

template <class T>
Bindings& Bindings::set_vector(Symbol s, std::span<const T> values) {
  if (s.kind() != SymbolKind::batch)
    throw invalid_argument_error("graphsafe: '" + s.name() + "' is a scalar symbol; bind it to one value");
  // The length is static: when bound, a vector of another length is refused here, before anything
  // sized from it. (Bound later, the replay's check sees the mismatch.)
  if (const Scalar* len = find_scalar(s.length().id()); len && static_cast<std::int64_t>(values.size()) != len->value)
    detail::bad_batch_length(s, values.size(), len->value);
  for (std::size_t i = 0; i < values.size(); ++i) check_value(s, values[i], i);
  auto& slot = vector_slot(s.id());
  slot.values.assign(values.begin(), values.end());  // reuses capacity: no allocation in steady state
  return *this;
}

Bindings& Bindings::set(Symbol s, std::span<const std::int64_t> values) { return set_vector(s, values); }
Bindings& Bindings::set(Symbol s, std::span<const std::int32_t> values) { return set_vector(s, values); }

const Bindings::Scalar* Bindings::find_scalar(std::uint32_t id) const {
  for (const auto& e : scalars_)
    if (e.id == id) return &e;
  return nullptr;
}
const Bindings::Vector* Bindings::find_vector(std::uint32_t id) const {
  for (const auto& e : vectors_)
    if (e.id == id) return &e;
  return nullptr;
}

bool Bindings::has(Symbol s) const {
  return s.kind() == SymbolKind::batch ? find_vector(s.id()) != nullptr : find_scalar(s.id()) != nullptr;
}

std::int64_t Bindings::value(Symbol s) const {
  if (const auto* e = find_scalar(s.id())) return e->value;
  if (s.kind() == SymbolKind::batch)
    throw invalid_argument_error("graphsafe: '" + s.name() +
                                 "' is a batch symbol with one value per request; read it with values(), "
                                 "or fold it into an extent with sum_over / max_over");
  throw unbound_symbol_error("graphsafe: symbol '" + s.name() +
                             "' is not bound; call bindings.set(" + s.name() + ", value) before sizing or replaying");
}

std::span<const std::int64_t> Bindings::values(Symbol s) const {
  if (const auto* e = find_vector(s.id())) return e->values;
  throw unbound_symbol_error("graphsafe: batch symbol '" + s.name() +
                             "' is not bound; call bindings.set(" + s.name() + ", {per-request values}) first");
}

std::string Bindings::describe(Symbol s) const {
  std::string out = s.name() + " = ";
  if (!has(s)) return out + "<unbound>";
  if (s.kind() != SymbolKind::batch) return out + std::to_string(value(s));
  auto v = values(s);
  out += "[";
  const std::size_t shown = std::min<std::size_t>(v.size(), 8);
  for (std::size_t i = 0; i < shown; ++i) out += (i ? ", " : "") + std::to_string(v[i]);
  if (v.size() > shown) out += ", ... (" + std::to_string(v.size()) + " values, max " +
                               std::to_string(*std::max_element(v.begin(), v.end())) + ")";
  return out + "]";
}

}  // namespace graphsafe
