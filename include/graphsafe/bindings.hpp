// Bindings: the current values of symbols. An engine has these on the host every step anyway
// (sequence lengths, batch size); graphsafe reads them to size requests at capture time and to
// check guards before each replay. Values are validated when set: negative values, values above a
// symbol's capacity and batch vectors whose length differs from their (bound) length symbol are
// errors naming the value and limit. When a batch changes size, bind the new length first; a replay
// checks every vector against its length again, whatever policy sized the graph.
#pragma once

#include <graphsafe/symbol.hpp>

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace graphsafe {

class Bindings {
 public:
  Bindings() = default;

  Bindings& set(Symbol s, std::int64_t value);                     // static / dynamic scalar
  Bindings& set(Symbol batch, std::span<const std::int64_t> values);  // batch symbol
  Bindings& set(Symbol batch, std::span<const std::int32_t> values);
  Bindings& set(Symbol batch, std::initializer_list<std::int64_t> values) {
    return set(batch, std::span<const std::int64_t>(values.begin(), values.size()));
  }

  bool has(Symbol s) const;
  // Throws unbound_symbol_error naming the symbol when not bound.
  std::int64_t value(Symbol s) const;
  std::span<const std::int64_t> values(Symbol batch) const;
  // "seq_lens = [15, 17]" / "batch = 2" / "seq_lens = <unbound>"
  std::string describe(Symbol s) const;

 private:
  struct Scalar {
    std::uint32_t id;
    std::int64_t value;
  };
  struct Vector {
    std::uint32_t id;
    std::vector<std::int64_t> values;
  };
  const Scalar* find_scalar(std::uint32_t id) const;
  const Vector* find_vector(std::uint32_t id) const;
  Vector& vector_slot(std::uint32_t id);
  void check_value(Symbol s, std::int64_t v, std::optional<std::size_t> index) const;

  template <class T>
  Bindings& set_vector(Symbol batch, std::span<const T> values);

  // Few symbols per graph: linear search over a flat vector beats a map.
  std::vector<Scalar> scalars_;
  std::vector<Vector> vectors_;
};

namespace detail {
// Throws invalid_argument_error: `batch` is bound to `values` values but its length symbol to `length`.
[[noreturn]] void bad_batch_length(Symbol batch, std::size_t values, std::int64_t length);
}  // namespace detail

}  // namespace graphsafe
