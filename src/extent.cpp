#include <graphsafe/bindings.hpp>
#include <graphsafe/error.hpp>
#include <graphsafe/extent.hpp>

#include <algorithm>
#include <charconv>
#include <initializer_list>
#include <string>
#include <string_view>

namespace graphsafe {
namespace detail {

enum class Op : std::uint8_t { constant, symbol, element, add, mul, max, min, ceil_div, floor_div, sum, max_over };

// One step of a fold body compiled to a chain x -> op(x, k) (see compile_chain below).
struct ChainStep {
  Op op;
  const ExtentNode* operand;  // evaluated once per evaluation; null when constant (then k)
  std::int64_t k;
};

struct ExtentNode {
  Op op;
  std::int64_t value = 0;   // constant
  std::uint32_t sym = 0;    // symbol / element / batch of sum & max_over
  std::shared_ptr<const ExtentNode> a, b;  // operands (body in a for sum / max_over)
  // Facts about the symbol, copied at construction so evaluation never touches the registry
  // (symbols are immutable): dynamic?, capacity (-1: none), and a fold's batch-length symbol.
  bool dyn = false;
  std::int64_t cap = -1;
  std::uint32_t len = 0;   // a fold's or an element's batch-length symbol
  bool mono_body = false;  // max_over: body monotone, so max_b f(x_b) = f(max_b x_b)
  // Facts about the whole subtree, computed once at construction (finish()) so the request path
  // never walks the tree for them. Extents are immutable, so they never go stale.
  bool stat = true;        // no dynamic symbol, no batch element (is_static)
  bool mono = true;        // monotone(): no divisor depends on a dynamic value
  bool capped = true;      // every dynamic symbol / element declares a capacity
  bool elem = false;       // contains a batch element (inside a fold body)
  std::uint32_t elem_of = 0;  // when elem: the batch symbol of that element (one per subtree)
  bool fold = false;       // contains sum_over / max_over
  // Value when the subtree is constants only (else -1); capacity bound when it needs no binding
  // (constants and capacities only; else -1, also when computing it would throw: the general
  // path then raises the error).
  std::int64_t fixed_value = -1;
  std::int64_t fixed_bound = -1;
  // sum: the body as a chain of steps applied to each element (chain_ok), evaluated without
  // walking the tree per element.
  bool chain_ok = false;
  std::vector<ChainStep> chain{};

  static Symbol symbol(std::uint32_t id) { return Symbol(id); }

  static Extent make(ExtentNode n);
  static const std::shared_ptr<const ExtentNode>& ptr(const Extent& e) { return e.node_; }
};

}  // namespace detail

using detail::ExtentNode;
using detail::ChainStep;
using detail::Op;

namespace {
void finish(ExtentNode& n);
}

Extent ExtentNode::make(ExtentNode n) {
  finish(n);
  return Extent(std::make_shared<const ExtentNode>(std::move(n)));
}

namespace {

std::int64_t checked_add(std::int64_t x, std::int64_t y, const char* what) {
  std::int64_t r;
  if (__builtin_add_overflow(x, y, &r))
    throw overflow_error(std::string("graphsafe: extent overflow in ") + what + ": " + std::to_string(x) +
                         " + " + std::to_string(y) + " does not fit in 64 bits; check the symbol values");
  return r;
}
std::int64_t checked_mul(std::int64_t x, std::int64_t y, const char* what) {
  std::int64_t r;
  if (__builtin_mul_overflow(x, y, &r))
    throw overflow_error(std::string("graphsafe: extent overflow in ") + what + ": " + std::to_string(x) +
                         " * " + std::to_string(y) + " does not fit in 64 bits; check the symbol values");
  return r;
}
std::int64_t ceil_div_checked(std::int64_t x, std::int64_t y) {
  if (y <= 0)
    throw invalid_argument_error("graphsafe: ceil_div by " + std::to_string(y) + "; the divisor must be >= 1");
  return x / y + (x % y != 0 ? 1 : 0);
}

Symbol sym_of(std::uint32_t id) { return ExtentNode::symbol(id); }

std::size_t batch_length(const Bindings& b, Symbol batch, Symbol length, std::span<const std::int64_t> v) {
  const auto len = b.value(length);
  if (static_cast<std::int64_t>(v.size()) != len) detail::bad_batch_length(batch, v.size(), len);
  return v.size();
}

enum class Mode { evaluate, bound };

bool sum_chain(const ExtentNode& n, const Bindings& b, std::span<const std::int64_t> v, std::int64_t& out);

std::int64_t eval(const ExtentNode& n, const Bindings& b, Mode mode, const std::int64_t* elem) {
  switch (n.op) {
    case Op::constant: return n.value;
    case Op::symbol: {
      const Symbol s = sym_of(n.sym);
      if (mode == Mode::bound && n.dyn) {
        if (n.cap >= 0) return n.cap;
        throw policy_refusal("graphsafe: dynamic symbol '" + s.name() +
                             "' has no capacity, so no replay-safe bound exists; declare one "
                             "(Symbol::dynamic(\"" + s.name() + "\", capacity)) or use static_query_bound");
      }
      return b.value(s);
    }
    case Op::element: {
      if (mode == Mode::bound) {
        if (n.cap >= 0) return n.cap;
        const Symbol s = sym_of(n.sym);
        throw policy_refusal("graphsafe: batch symbol '" + s.name() +
                             "' has no capacity, so no replay-safe bound exists; declare one "
                             "(Symbol::batch(\"" + s.name() + "\", length, capacity)) or use static_query_bound");
      }
      return *elem;
    }
    case Op::add: return checked_add(eval(*n.a, b, mode, elem), eval(*n.b, b, mode, elem), "+");
    case Op::mul: return checked_mul(eval(*n.a, b, mode, elem), eval(*n.b, b, mode, elem), "*");
    case Op::max: return std::max(eval(*n.a, b, mode, elem), eval(*n.b, b, mode, elem));
    case Op::min: return std::min(eval(*n.a, b, mode, elem), eval(*n.b, b, mode, elem));
    case Op::ceil_div: {
      // The divisor is evaluated exactly even when bounding: bounding it by its capacity would
      // give a *smaller* quotient. Extent::monotone() rejects dynamic divisors before we get here.
      const std::int64_t d = eval(*n.b, b, Mode::evaluate, elem);
      return ceil_div_checked(eval(*n.a, b, mode, elem), d);
    }
    case Op::floor_div: {
      const std::int64_t d = eval(*n.b, b, Mode::evaluate, elem);
      if (d <= 0)
        throw invalid_argument_error("graphsafe: floor_div by " + std::to_string(d) + "; the divisor must be >= 1");
      return eval(*n.a, b, mode, elem) / d;
    }
    case Op::sum: {
      const Symbol s = sym_of(n.sym);
      if (mode == Mode::bound) {
        const std::int64_t len = b.value(sym_of(n.len));
        return checked_mul(len, eval(*n.a, b, mode, nullptr), "sum bound");
      }
      auto v = b.values(s);
      batch_length(b, s, sym_of(n.len), v);
      std::int64_t acc = 0;
      if (n.chain_ok && sum_chain(n, b, v, acc)) return acc;
      acc = 0;  // the tree walk below computes the value or throws the exact error
      for (std::int64_t x : v) acc = checked_add(acc, eval(*n.a, b, mode, &x), "sum");
      return acc;
    }
    case Op::max_over: {
      const Symbol s = sym_of(n.sym);
      if (mode == Mode::bound) return b.value(sym_of(n.len)) > 0 ? eval(*n.a, b, mode, nullptr) : 0;
      auto v = b.values(s);
      batch_length(b, s, sym_of(n.len), v);
      if (n.mono_body) {  // one evaluation of the body at the largest element
        if (v.empty()) return 0;
        const std::int64_t m = *std::max_element(v.begin(), v.end());
        return std::max<std::int64_t>(0, eval(*n.a, b, mode, &m));
      }
      std::int64_t acc = 0;
      for (std::int64_t x : v) acc = std::max(acc, eval(*n.a, b, mode, &x));
      return acc;
    }
  }
  return 0;
}

void collect(const ExtentNode& n, std::vector<std::uint32_t>& out) {
  auto push = [&](std::uint32_t id) {
    if (std::find(out.begin(), out.end(), id) == out.end()) out.push_back(id);
  };
  switch (n.op) {
    case Op::constant: return;
    case Op::symbol: push(n.sym); return;
    case Op::element:  // inside its fold these are already listed; outside, evaluation refuses it
      push(n.sym);
      push(n.len);
      return;
    case Op::sum:
    case Op::max_over:
      push(n.sym);
      push(n.len);
      collect(*n.a, out);
      return;
    default:
      collect(*n.a, out);
      collect(*n.b, out);
  }
}

bool depends_on_dynamic(const ExtentNode& n) { return !n.stat; }
bool monotone_node(const ExtentNode& n) { return n.mono; }

// ---- construction-time facts ----------------------------------------------------------------------

// x op y for the fixed_value / fixed_bound facts; -1 where evaluating would throw (the general
// path then raises the error with its message).
std::int64_t fixed_op(Op op, std::int64_t x, std::int64_t y) {
  if (x < 0 || y < 0) return -1;
  std::int64_t r = 0;
  switch (op) {
    case Op::add: return __builtin_add_overflow(x, y, &r) ? -1 : r;
    case Op::mul: return __builtin_mul_overflow(x, y, &r) ? -1 : r;
    case Op::max: return std::max(x, y);
    case Op::min: return std::min(x, y);
    case Op::ceil_div: return y <= 0 ? -1 : x / y + (x % y != 0 ? 1 : 0);
    case Op::floor_div: return y <= 0 ? -1 : x / y;
    default: return -1;
  }
}

void finish(ExtentNode& n) {
  switch (n.op) {
    case Op::constant:
      n.fixed_value = n.fixed_bound = n.value;
      return;
    case Op::symbol:
      n.stat = !n.dyn;
      n.capped = !n.dyn || n.cap >= 0;
      n.fixed_bound = n.dyn && n.cap >= 0 ? n.cap : -1;
      return;
    case Op::element:
      n.stat = false;
      n.capped = n.cap >= 0;
      n.elem = true;
      n.elem_of = n.sym;
      return;
    case Op::sum:
    case Op::max_over:
      n.stat = false;
      n.mono = n.a->mono;
      n.capped = n.a->capped;
      n.fold = true;
      return;
    default: {
      const ExtentNode& x = *n.a;
      const ExtentNode& y = *n.b;
      n.stat = x.stat && y.stat;
      const bool div = n.op == Op::ceil_div || n.op == Op::floor_div;
      n.mono = div ? y.stat && x.mono : x.mono && y.mono;
      n.capped = x.capped && y.capped;
      // An element stands for the current request of its own fold only: two batches' elements in
      // one expression cannot both be current (one of them escaped its fold).
      if (x.elem && y.elem && x.elem_of != y.elem_of)
        throw invalid_argument_error("graphsafe: an extent combines the elements of batch symbols '" +
                                     sym_of(x.elem_of).name() + "' and '" + sym_of(y.elem_of).name() +
                                     "'; an element is valid only inside the sum_over/max_over over its own batch -- "
                                     "fold each batch separately and combine the results");
      n.elem = x.elem || y.elem;
      n.elem_of = x.elem ? x.elem_of : y.elem_of;
      n.fold = x.fold || y.fold;
      n.fixed_value = fixed_op(n.op, x.fixed_value, y.fixed_value);
      // Bounding evaluates a divisor exactly (never by its capacity).
      n.fixed_bound = n.mono ? fixed_op(n.op, x.fixed_bound, div ? y.fixed_value : y.fixed_bound) : -1;
      return;
    }
  }
}

// A fold body as a chain: the element, then steps x -> op(x, k) where every k is an operand
// without the element (a constant, or a subtree evaluated once per evaluation). Holds for bodies
// such as ceil_div(l, 4), min(l, W), round_up(l, 64) * heads; others keep the tree walk.
constexpr std::size_t kMaxChain = 8;

bool compile_chain(const ExtentNode& n, std::vector<ChainStep>& out) {
  if (n.op == Op::element) return true;
  const ExtentNode* x = nullptr;  // the side holding the element
  const ExtentNode* k = nullptr;
  switch (n.op) {
    case Op::add:
    case Op::mul:
    case Op::max:
    case Op::min:
      if (n.a->elem == n.b->elem) return false;
      x = n.a->elem ? n.a.get() : n.b.get();
      k = n.a->elem ? n.b.get() : n.a.get();
      break;
    case Op::ceil_div:
    case Op::floor_div:
      if (!n.a->elem || n.b->elem) return false;
      x = n.a.get();
      k = n.b.get();
      break;
    default: return false;
  }
  if (!compile_chain(*x, out) || out.size() == kMaxChain) return false;
  out.push_back({n.op, k->fixed_value >= 0 ? nullptr : k, k->fixed_value});
  return true;
}

// sum_b body(v[b]) through the chain, in unsigned arithmetic on values that are all >= 0 (bound
// values are validated, operations keep them so): true with the sum in `out`, or false when
// anything is off (an operand that throws, a divisor <= 0, an overflow, a negative value) and the
// caller's tree walk must produce the result or its exact error. No step depends on another
// element, so each runs over a block of elements in a tight loop.
bool sum_chain(const ExtentNode& n, const Bindings& b, std::span<const std::int64_t> v, std::int64_t& out) {
  const std::size_t m = n.chain.size();
  std::uint64_t k[kMaxChain];
  int shift[kMaxChain];  // divisor 2^shift (else -1)
  if (v.empty()) {  // the tree walk evaluates no operand either
    out = 0;
    return true;
  }
  for (std::size_t i = 0; i < m; ++i) {
    const ChainStep& st = n.chain[i];
    std::int64_t kv = st.k;
    if (st.operand) {
      try {
        kv = eval(*st.operand, b, Mode::evaluate, nullptr);
      } catch (...) {
        return false;
      }
    }
    const bool div = st.op == Op::ceil_div || st.op == Op::floor_div;
    if (kv < 0 || (div && kv == 0)) return false;
    k[i] = static_cast<std::uint64_t>(kv);
    shift[i] = div && (k[i] & (k[i] - 1)) == 0 ? __builtin_ctzll(k[i]) : -1;
  }
  if (m <= 1) {  // the common bodies (l, ceil_div(l, 4), min(l, W), ...): one fused loop
    // Per block of 64 elements, a plain sum and an OR of every value (loops the compiler can
    // vectorize): while every value is < 2^57 a block sums to < 2^63 and the running total
    // cannot wrap before its bit 63 is checked. Larger values (or a negative one) take the tree walk.
    std::uint64_t acc = 0;
    bool ok = true;
    auto fused = [&](auto f) {
      constexpr std::size_t kBlock = 64;
      for (std::size_t base = 0; base < v.size(); base += kBlock) {
        const std::size_t c = std::min(kBlock, v.size() - base);
        const std::int64_t* p = v.data() + base;
        std::uint64_t sum = 0;
        std::uint64_t any = 0;
        for (std::size_t j = 0; j < c; ++j) {
          const auto x = static_cast<std::uint64_t>(p[j]);
          const std::uint64_t y = f(x);
          sum += y;
          any |= x | y;
        }
        acc += sum;
        if ((any >> 57) | (acc >> 63)) {
          ok = false;
          return;
        }
      }
    };
    const std::uint64_t kk = m ? k[0] : 0;
    const int sh = m ? shift[0] : -1;
    switch (m ? n.chain[0].op : Op::element) {
      case Op::element: fused([](std::uint64_t x) { return x; }); break;
      case Op::add: fused([kk](std::uint64_t x) { return x + kk; }); break;  // no wrap: bit 63 flags
      case Op::mul:
        fused([kk](std::uint64_t x) {
          std::uint64_t r;
          return __builtin_mul_overflow(x, kk, &r) ? ~0ull : r;
        });
        break;
      case Op::max: fused([kk](std::uint64_t x) { return std::max(x, kk); }); break;
      case Op::min: fused([kk](std::uint64_t x) { return std::min(x, kk); }); break;
      case Op::ceil_div:
        if (sh >= 0)
          fused([kk, sh](std::uint64_t x) { return (x + (kk - 1)) >> sh; });
        else
          fused([kk](std::uint64_t x) { return x / kk + (x % kk != 0 ? 1 : 0); });
        break;
      case Op::floor_div:
        if (sh >= 0)
          fused([sh](std::uint64_t x) { return x >> sh; });
        else
          fused([kk](std::uint64_t x) { return x / kk; });
        break;
      default: return false;
    }
    if (!ok) return false;
    out = static_cast<std::int64_t>(acc);
    return true;
  }
  // Longer chains: each step over a block of elements in its own tight loop.
  constexpr std::size_t kBlock = 64;
  std::uint64_t x[kBlock];
  std::uint64_t acc = 0;
  std::uint64_t bad = 0;  // bit 63 set: a value left [0, 2^63)
  for (std::size_t base = 0; base < v.size(); base += kBlock) {
    const std::size_t c = std::min(kBlock, v.size() - base);
    for (std::size_t j = 0; j < c; ++j) {
      x[j] = static_cast<std::uint64_t>(v[base + j]);
      bad |= x[j];
    }
    for (std::size_t i = 0; i < m; ++i) {
      const std::uint64_t kk = k[i];
      switch (n.chain[i].op) {
        case Op::add:  // both < 2^63: the sum cannot wrap, bit 63 flags a 64-bit signed overflow
          for (std::size_t j = 0; j < c; ++j) {
            x[j] += kk;
            bad |= x[j];
          }
          break;
        case Op::mul:
          for (std::size_t j = 0; j < c; ++j) {
            std::uint64_t r;
            if (__builtin_mul_overflow(x[j], kk, &r)) r = ~0ull;
            x[j] = r;
            bad |= r;
          }
          break;
        case Op::max:
          for (std::size_t j = 0; j < c; ++j) x[j] = std::max(x[j], kk);
          break;
        case Op::min:
          for (std::size_t j = 0; j < c; ++j) x[j] = std::min(x[j], kk);
          break;
        case Op::ceil_div:
          if (shift[i] >= 0) {
            const int sh = shift[i];
            for (std::size_t j = 0; j < c; ++j) x[j] = (x[j] + (kk - 1)) >> sh;  // < 2^64: no wrap
          } else {
            for (std::size_t j = 0; j < c; ++j) x[j] = x[j] / kk + (x[j] % kk != 0 ? 1 : 0);
          }
          break;
        case Op::floor_div:
          if (shift[i] >= 0) {
            const int sh = shift[i];
            for (std::size_t j = 0; j < c; ++j) x[j] >>= sh;
          } else {
            for (std::size_t j = 0; j < c; ++j) x[j] /= kk;
          }
          break;
        default: return false;
      }
    }
    for (std::size_t j = 0; j < c; ++j) {
      acc += x[j];  // acc and x[j] < 2^63 while nothing is bad: cannot wrap
      bad |= acc;
    }
    if (bad >> 63) return false;
  }
  out = static_cast<std::int64_t>(acc);
  return true;
}

// Appended into one string (to_string runs on every captured request: no temporaries).
void str_into(const ExtentNode& n, std::string& out) {
  auto bin = [&](std::string_view op) {
    out += '(';
    str_into(*n.a, out);
    out += ' ';
    out += op;
    out += ' ';
    str_into(*n.b, out);
    out += ')';
  };
  auto fn = [&](std::string_view f) {
    out += f;
    out += '(';
    str_into(*n.a, out);
    out += ", ";
    str_into(*n.b, out);
    out += ')';
  };
  auto unary = [&](std::string_view f) {
    out += f;
    str_into(*n.a, out);
    out += ')';
  };
  switch (n.op) {
    case Op::constant: {
      char buf[24];
      const auto [end, ec] = std::to_chars(buf, buf + sizeof buf, n.value);
      out.append(buf, end);
      return;
    }
    case Op::symbol: out += sym_of(n.sym).name(); return;
    case Op::element:
      out += sym_of(n.sym).name();
      out += "[b]";
      return;
    case Op::add: return bin("+");
    case Op::mul: return bin("*");
    case Op::max: return fn("max");
    case Op::min: return fn("min");
    case Op::ceil_div: return fn("ceil_div");
    case Op::floor_div: return fn("floor_div");
    case Op::sum: return unary("sum_b(");
    case Op::max_over: return unary("max_b(");
  }
  out += '?';
}

std::size_t hash_node(const ExtentNode& n) {
  std::size_t h = static_cast<std::size_t>(n.op) * 0x9E3779B97F4A7C15ull;
  h ^= static_cast<std::size_t>(n.value) + 0x632BE59BD9B4E019ull + (h << 6) + (h >> 2);
  h ^= static_cast<std::size_t>(n.sym) + 0x85EBCA77C2B2AE63ull + (h << 6) + (h >> 2);
  if (n.a) h ^= hash_node(*n.a) + (h << 6) + (h >> 2);
  if (n.b) h ^= hash_node(*n.b) * 31 + (h << 6) + (h >> 2);
  return h;
}

bool same_node(const ExtentNode& x, const ExtentNode& y) {
  if (&x == &y) return true;
  if (x.op != y.op || x.value != y.value || x.sym != y.sym) return false;
  if (static_cast<bool>(x.a) != static_cast<bool>(y.a) || static_cast<bool>(x.b) != static_cast<bool>(y.b)) return false;
  return (!x.a || same_node(*x.a, *y.a)) && (!x.b || same_node(*x.b, *y.b));
}

}  // namespace

// ---- public API --------------------------------------------------------------------------------

Extent::Extent(std::int64_t constant) {
  if (constant < 0)
    throw invalid_argument_error("graphsafe: extent constant " + std::to_string(constant) +
                                 " is negative; extents count elements and must be >= 0");
  *this = ExtentNode::make({Op::constant, constant, 0, nullptr, nullptr});
}

Extent::Extent(Symbol s) {
  if (s.kind() == SymbolKind::batch)
    throw invalid_argument_error("graphsafe: batch symbol '" + s.name() +
                                 "' has one value per request; use sum_over or max_over to fold it");
  ExtentNode n{Op::symbol, 0, s.id(), nullptr, nullptr};
  n.dyn = s.is_dynamic();
  n.cap = s.capacity().value_or(-1);
  *this = ExtentNode::make(std::move(n));
}

namespace {
Extent binary(Op op, const Extent& a, const Extent& b) {
  return ExtentNode::make({op, 0, 0, ExtentNode::ptr(a), ExtentNode::ptr(b)});
}
bool contains_fold(const ExtentNode& n) { return n.fold; }
Extent fold(Op op, Symbol batch, const std::function<Extent(const Extent&)>& body) {
  if (batch.kind() != SymbolKind::batch)
    throw invalid_argument_error("graphsafe: sum_over/max_over need a batch symbol; '" + batch.name() +
                                 "' is a scalar (declare it with Symbol::batch)");
  ExtentNode e{Op::element, 0, batch.id(), nullptr, nullptr};
  e.dyn = true;
  e.cap = batch.capacity().value_or(-1);
  e.len = batch.length().id();
  const Extent element = ExtentNode::make(std::move(e));
  const Extent b = body(element);
  const ExtentNode& bn = *ExtentNode::ptr(b);
  if (contains_fold(bn))
    throw invalid_argument_error("graphsafe: nested sum_over/max_over is not supported (batch '" + batch.name() +
                                 "'); fold each batch separately and combine the results");
  if (bn.elem && bn.elem_of != batch.id())
    throw invalid_argument_error("graphsafe: the body of a sum_over/max_over over '" + batch.name() +
                                 "' uses the element of batch symbol '" + sym_of(bn.elem_of).name() +
                                 "', which escaped its own fold; it would read '" + batch.name() +
                                 "' values in its place -- fold each batch separately and combine the results");
  ExtentNode f{op, 0, batch.id(), ExtentNode::ptr(b), nullptr};
  f.dyn = true;
  f.len = batch.length().id();
  f.mono_body = op == Op::max_over && monotone_node(bn);
  if (op == Op::sum) f.chain_ok = compile_chain(bn, f.chain);
  return ExtentNode::make(std::move(f));
}
}  // namespace

Extent operator+(const Extent& a, const Extent& b) { return binary(Op::add, a, b); }
Extent operator*(const Extent& a, const Extent& b) { return binary(Op::mul, a, b); }
Extent max(const Extent& a, const Extent& b) { return binary(Op::max, a, b); }
Extent min(const Extent& a, const Extent& b) { return binary(Op::min, a, b); }
Extent ceil_div(const Extent& a, const Extent& b) { return binary(Op::ceil_div, a, b); }
Extent floor_div(const Extent& a, const Extent& b) { return binary(Op::floor_div, a, b); }
Extent round_up(const Extent& a, const Extent& multiple) { return ceil_div(a, multiple) * multiple; }

Extent sum_over(Symbol batch, const std::function<Extent(const Extent&)>& body) { return fold(Op::sum, batch, body); }
Extent max_over(Symbol batch, const std::function<Extent(const Extent&)>& body) { return fold(Op::max_over, batch, body); }

namespace {
// An element outside every fold (its sum_over/max_over body let it out): no request is current.
void refuse_escaped_element(const Extent& e, const ExtentNode& n) {
  if (n.elem) [[unlikely]]
    throw invalid_argument_error("graphsafe: extent " + e.to_string() + " uses the element of batch symbol '" +
                                 sym_of(n.elem_of).name() +
                                 "' outside the sum_over/max_over that made it; an element stands for one request's "
                                 "value only inside its fold's body -- build the expression inside the body");
}
// The general cases, out of line so the constant fast paths below need no stack frame.
[[gnu::noinline]] std::int64_t evaluate_walk(const Extent& e, const ExtentNode& n, const Bindings& b) {
  refuse_escaped_element(e, n);
  return eval(n, b, Mode::evaluate, nullptr);
}
[[gnu::noinline]] std::int64_t bound_walk(const Extent& e, const ExtentNode& n, const Bindings& b) {
  refuse_escaped_element(e, n);
  if (!n.mono)
    throw policy_refusal("graphsafe: extent " + e.to_string() +
                         " divides by a dynamic value, so substituting capacities does not bound it; "
                         "make the divisor static or size it with static_query_bound");
  return eval(n, b, Mode::bound, nullptr);
}
}  // namespace

std::int64_t Extent::evaluate(const Bindings& b) const {
  if (node_->fixed_value >= 0) return node_->fixed_value;  // constants only
  return evaluate_walk(*this, *node_, b);
}

std::int64_t Extent::capacity_bound(const Bindings& b) const {
  if (node_->fixed_bound >= 0) return node_->fixed_bound;  // constants and capacities only
  return bound_walk(*this, *node_, b);
}

std::vector<Symbol> Extent::symbols() const {
  std::vector<std::uint32_t> ids;
  collect(*node_, ids);
  std::vector<Symbol> out;
  for (auto id : ids) out.push_back(Symbol::from_id(id));
  return out;
}

std::vector<Symbol> Extent::dynamic_symbols() const {
  std::vector<Symbol> out;
  for (Symbol s : symbols())
    if (s.is_dynamic()) out.push_back(s);
  return out;
}

bool Extent::monotone() const { return monotone_node(*node_); }
bool Extent::is_static() const { return !depends_on_dynamic(*node_); }

bool Extent::has_capacity_bound() const { return node_->mono && node_->capped; }
std::string Extent::to_string() const {
  std::string out;
  out.reserve(64);
  str_into(*node_, out);
  return out;
}
std::size_t Extent::hash() const { return hash_node(*node_); }
bool same_expression(const Extent& a, const Extent& b) { return same_node(*a.node_, *b.node_); }

}  // namespace graphsafe
