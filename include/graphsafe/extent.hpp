// Extents: workspace sizes as expressions that know what they depend on.
//
//   Symbol B = Symbol::fixed("batch");
//   Symbol L = Symbol::batch("seq_lens", B, /*capacity=*/max_model_len);
//   Extent rows = sum_over(L, [](Extent l) { return ceil_div(l, 4); });   // sum_b ceil(L[b]/4)
//   Extent swa  = Extent(B) * 128;                                        // static only
//
// An Extent evaluates under Bindings, lists the dynamic symbols it depends on, and is bounded by
// substituting capacities. All operations are monotone non-decreasing in every symbol except the
// divisor of ceil_div / floor_div; an extent whose divisor depends on a dynamic symbol reports !monotone() and
// is never bounded by substitution.
#pragma once

#include <graphsafe/symbol.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace graphsafe {

class Bindings;

namespace detail {
struct ExtentNode;
}

class Extent {
 public:
  Extent(std::int64_t constant);  // NOLINT: implicit, so `rows * 512` reads naturally
  Extent(int constant) : Extent(static_cast<std::int64_t>(constant)) {}  // NOLINT
  Extent(Symbol scalar);          // NOLINT: a static or dynamic scalar symbol (not a batch symbol)

  friend Extent operator+(const Extent& a, const Extent& b);
  friend Extent operator*(const Extent& a, const Extent& b);
  friend Extent max(const Extent& a, const Extent& b);
  friend Extent min(const Extent& a, const Extent& b);
  friend Extent ceil_div(const Extent& a, const Extent& b);
  friend Extent floor_div(const Extent& a, const Extent& b);
  friend Extent round_up(const Extent& a, const Extent& multiple);
  // sum / max over the elements of a batch symbol: body(element) for each request. The element is
  // valid only in what body returns: one kept past the fold is refused by evaluation, one used in
  // another batch's fold by that fold (invalid_argument_error naming both batches).
  friend Extent sum_over(Symbol batch, const std::function<Extent(const Extent&)>& body);
  friend Extent max_over(Symbol batch, const std::function<Extent(const Extent&)>& body);

  // Value under the bindings; throws unbound_symbol_error / overflow_error.
  std::int64_t evaluate(const Bindings& b) const;
  // Upper bound over every value the dynamic symbols may take: dynamic symbols are replaced by
  // their capacities, static ones by their bound values. Throws policy_refusal naming the first
  // dynamic symbol without a capacity (or the non-monotone divisor).
  std::int64_t capacity_bound(const Bindings& b) const;
  // Every symbol referenced (batch symbols and their length symbols included), in first-use order.
  std::vector<Symbol> symbols() const;
  std::vector<Symbol> dynamic_symbols() const;
  bool is_static() const;  // no dynamic symbol (cheap: no allocation)
  bool monotone() const;
  // Substituting capacities bounds it: monotone, and every dynamic symbol declares a capacity.
  bool has_capacity_bound() const;
  // Readable form for reports: "(sum_b(ceil_div(seq_lens[b], 4)) * 512)".
  std::string to_string() const;

  // Structural identity, used to share guards between requests with the same extent.
  std::size_t hash() const;
  friend bool same_expression(const Extent& a, const Extent& b);

 private:
  explicit Extent(std::shared_ptr<const detail::ExtentNode> n) : node_(std::move(n)) {}
  std::shared_ptr<const detail::ExtentNode> node_;
  friend struct detail::ExtentNode;
};

Extent operator+(const Extent& a, const Extent& b);
Extent operator*(const Extent& a, const Extent& b);
Extent max(const Extent& a, const Extent& b);
Extent min(const Extent& a, const Extent& b);
Extent ceil_div(const Extent& a, const Extent& b);
Extent floor_div(const Extent& a, const Extent& b);  // n_c = L / r
Extent round_up(const Extent& a, const Extent& multiple);
Extent sum_over(Symbol batch, const std::function<Extent(const Extent&)>& body);
Extent max_over(Symbol batch, const std::function<Extent(const Extent&)>& body);

}  // namespace graphsafe
