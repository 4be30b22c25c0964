// Symbols, extents, bindings, sizing policies and guard violations.
#include "common.hpp"

#include <nanobind/ndarray.h>
#include <nanobind/trampoline.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/string_view.h>
#include <nanobind/stl/vector.h>

#include <vector>

namespace graphsafe::python {
namespace {

const char* kind_name(SymbolKind k) {
  switch (k) {
    case SymbolKind::static_value: return "fixed";
    case SymbolKind::dynamic_value: return "dynamic";
    case SymbolKind::batch: return "batch";
  }
  return "?";
}

std::string symbol_repr(Symbol s) {
  std::string r = std::string("Symbol.") + kind_name(s.kind()) + "('" + s.name() + "'";
  if (s.kind() == SymbolKind::batch) r += ", length='" + s.length().name() + "'";
  if (auto c = s.capacity()) r += ", capacity=" + std::to_string(*c);
  return r + ")";
}

// A sizing policy written in Python (a subclass of graphsafe.SizingPolicy). size() may run where
// the GIL is released (a re-capture inside a replay): it takes the GIL.
class PySizingPolicy final : public SizingPolicy {
 public:
  NB_TRAMPOLINE(SizingPolicy);
  explicit PySizingPolicy(std::string name) : name_(std::move(name)) {}
  std::string_view name() const override { return name_; }
  SizingDecision size(std::string_view request, const Extent& need, const Bindings& b, bool capturing) const override {
    nb::gil_scoped_acquire gil;
    NB_OVERRIDE_PURE(size, request, need, b, capturing);
  }

 private:
  std::string name_;
};

Extent extent_of(nb::handle h, const char* what) {
  Extent e(std::int64_t{0});
  if (nb::try_cast<Extent>(h, e)) return e;
  throw nb::type_error((std::string("graphsafe: ") + what + " must be an Extent, a Symbol or an int, not " +
                        nb::cast<std::string>(nb::repr(h.type())))
                           .c_str());
}

[[noreturn]] void no_subtraction() {
  throw nb::type_error(
      "graphsafe: extents have no subtraction: every extent is monotone non-decreasing in its symbols, which is "
      "what lets capacity_bound bound it by substituting capacities. Write the need as a sum (or use max/min).");
}

std::vector<std::int64_t> int_sequence(nb::handle seq, Symbol s) {
  std::vector<std::int64_t> v;
  for (nb::handle item : seq) {
    if (!PyIndex_Check(item.ptr()))
      throw invalid_argument_error("graphsafe: values of batch symbol '" + s.name() + "' must be integers, got " +
                                   nb::cast<std::string>(nb::repr(item)));
    nb::object i = nb::steal(PyNumber_Index(item.ptr()));
    if (!i.is_valid()) throw nb::python_error();
    v.push_back(nb::cast<std::int64_t>(i));
  }
  return v;
}

}  // namespace

// A value for `s`: an int (or 0-d integer array / tensor), a sequence of ints, or a 1-d integer
// array / tensor on the host (int64 and int32 are read in place, others element by element).
void set_value(Bindings& b, Symbol s, nb::handle v) {
  if (nb::hasattr(v, "__dlpack_device__")) {
    nb::tuple dev = nb::cast<nb::tuple>(v.attr("__dlpack_device__")());
    int type = nb::cast<int>(dev[0]);
    if (type != 1 && type != 3)  // kDLCPU, kDLCUDAHost
      throw invalid_argument_error(
          "graphsafe: the value for '" + s.name() +
          "' is in device memory; bindings hold host values (the engine's CPU copy): reading a device tensor here "
          "would synchronize the stream (and freeze the value inside a capture). Pass the host copy.");
    nb::ndarray<const std::int64_t, nb::ndim<1>, nb::device::cpu, nb::c_contig> a64;
    if (nb::try_cast(v, a64, false)) {
      b.set(s, std::span<const std::int64_t>(a64.data(), a64.shape(0)));
      return;
    }
    nb::ndarray<const std::int32_t, nb::ndim<1>, nb::device::cpu, nb::c_contig> a32;
    if (nb::try_cast(v, a32, false)) {
      b.set(s, std::span<const std::int32_t>(a32.data(), a32.shape(0)));
      return;
    }
    nb::ndarray<nb::device::cpu> any;
    if (nb::try_cast(v, any, false) && any.ndim() == 0) {
      nb::object i = nb::steal(PyNumber_Index(v.ptr()));
      if (!i.is_valid()) throw nb::python_error();
      b.set(s, nb::cast<std::int64_t>(i));
      return;
    }
    if (nb::hasattr(v, "tolist")) {
      nb::object l = v.attr("tolist")();
      if (PyIndex_Check(l.ptr())) {
        b.set(s, nb::cast<std::int64_t>(nb::steal(PyNumber_Index(l.ptr()))));
      } else {
        auto vals = int_sequence(l, s);
        b.set(s, std::span<const std::int64_t>(vals));
      }
      return;
    }
  }
  if (PyBool_Check(v.ptr()))
    throw invalid_argument_error("graphsafe: the value for '" + s.name() + "' is a bool; pass an integer");
  if (PyIndex_Check(v.ptr())) {
    nb::object i = nb::steal(PyNumber_Index(v.ptr()));
    if (!i.is_valid()) throw nb::python_error();
    std::int64_t x = 0;
    if (!nb::try_cast<std::int64_t>(i, x))
      throw overflow_error("graphsafe: the value for '" + s.name() + "' (" + nb::cast<std::string>(nb::str(i)) +
                           ") does not fit in 64 bits");
    b.set(s, x);
    return;
  }
  if (PySequence_Check(v.ptr()) && !PyUnicode_Check(v.ptr())) {
    auto vals = int_sequence(v, s);
    b.set(s, std::span<const std::int64_t>(vals));
    return;
  }
  throw invalid_argument_error("graphsafe: cannot bind '" + s.name() + "' to " + nb::cast<std::string>(nb::repr(v)) +
                               ": expected an int, a sequence of ints or a 1-d integer array/tensor");
}

Bindings to_bindings(nb::handle h) {
  if (h.is_none()) return Bindings();
  Bindings* b = nullptr;
  if (nb::try_cast<Bindings*>(h, b) && b) return *b;
  if (PyDict_Check(h.ptr())) {
    Bindings out;
    for (auto [k, v] : nb::borrow<nb::dict>(h)) set_value(out, nb::cast<Symbol>(k), v);
    return out;
  }
  throw nb::type_error(("graphsafe: expected Bindings or a dict {Symbol: value}, not " +
                        nb::cast<std::string>(nb::repr(h.type())))
                           .c_str());
}

const Bindings& bindings_arg(nb::handle h, Bindings& storage) {
  Bindings* b = nullptr;
  if (nb::try_cast<Bindings*>(h, b) && b) return *b;
  storage = to_bindings(h);
  return storage;
}

nb::object binding_value(const Bindings& b, Symbol s) {
  if (s.kind() == SymbolKind::batch) {
    nb::list l;
    for (std::int64_t x : b.values(s)) l.append(x);
    return l;
  }
  return nb::int_(b.value(s));
}

void bind_model(nb::module_& m) {
  using namespace nb::literals;

  auto sym = nb::class_<Symbol>(m, "Symbol",
                     "A named host quantity a workspace size is computed from: fixed (for a graph's life), dynamic "
                     "(changes between replays, optionally bounded by a capacity) or batch (one dynamic value per "
                     "request). Compare by identity; combine with + * // into Extents.")
      .def_static("fixed", &Symbol::fixed, "name"_a)
      .def_static("dynamic", &Symbol::dynamic, "name"_a, nb::arg("capacity").none() = nb::none())
      .def_static("batch", &Symbol::batch, "name"_a, "length"_a, nb::arg("capacity").none() = nb::none())
      .def_static("from_id", &Symbol::from_id, "id"_a)
      .def_prop_ro("id", &Symbol::id)
      .def_prop_ro("name", &Symbol::name)
      .def_prop_ro("kind", [](Symbol s) { return kind_name(s.kind()); })
      .def_prop_ro("is_dynamic", &Symbol::is_dynamic)
      .def_prop_ro("capacity", &Symbol::capacity)
      .def_prop_ro("length", [](Symbol s) -> std::optional<Symbol> {
        if (s.kind() != SymbolKind::batch) return std::nullopt;
        return s.length();
      })
      .def("__eq__", [](Symbol a, nb::handle b) {
        Symbol* o = nullptr;
        return nb::try_cast<Symbol*>(b, o) && o && *o == a;
      })
      .def("__hash__", [](Symbol s) { return static_cast<std::size_t>(s.id()); })
      .def("__repr__", &symbol_repr)
      .def("__str__", [](Symbol s) { return s.name(); });

  auto ext = nb::class_<Extent>(m, "Extent",
                     "A workspace size as an expression over symbols: evaluates under Bindings, knows the dynamic "
                     "symbols it depends on and is bounded by substituting capacities.")
      .def(nb::init_implicit<std::int64_t>(), "constant"_a)
      .def(nb::init_implicit<Symbol>(), "symbol"_a)
      .def("evaluate", [](const Extent& e, nb::handle b) { return e.evaluate(to_bindings(b)); }, "bindings"_a)
      .def("capacity_bound", [](const Extent& e, nb::handle b) { return e.capacity_bound(to_bindings(b)); },
           nb::arg("bindings").none() = nb::none())
      .def_prop_ro("symbols", &Extent::symbols)
      .def_prop_ro("dynamic_symbols", &Extent::dynamic_symbols)
      .def_prop_ro("is_static", &Extent::is_static)
      .def_prop_ro("monotone", &Extent::monotone)
      .def_prop_ro("has_capacity_bound", &Extent::has_capacity_bound)
      .def("same_as", [](const Extent& a, const Extent& b) { return same_expression(a, b); }, "other"_a,
           "Structural identity (the test the plan uses to share one guard between requests).")
      .def("__hash__", &Extent::hash)
      .def("__str__", &Extent::to_string)
      .def("__repr__", [](const Extent& e) { return "Extent(" + e.to_string() + ")"; });

  // The arithmetic, for Extent and Symbol alike (a Symbol is an Extent's leaf).
  auto arithmetic = [](auto& cls) {
    using Self = typename std::remove_reference_t<decltype(cls)>::Type;
    cls.def("__add__", [](const Self& a, const Extent& b) { return Extent(a) + b; }, nb::is_operator())
        .def("__radd__", [](const Self& a, const Extent& b) { return b + Extent(a); }, nb::is_operator())
        .def("__mul__", [](const Self& a, const Extent& b) { return Extent(a) * b; }, nb::is_operator())
        .def("__rmul__", [](const Self& a, const Extent& b) { return b * Extent(a); }, nb::is_operator())
        .def("__floordiv__", [](const Self& a, const Extent& b) { return floor_div(Extent(a), b); }, nb::is_operator())
        .def("__rfloordiv__", [](const Self& a, const Extent& b) { return floor_div(b, Extent(a)); }, nb::is_operator())
        .def("__sub__", [](const Self&, nb::handle) -> Extent { no_subtraction(); })
        .def("__rsub__", [](const Self&, nb::handle) -> Extent { no_subtraction(); })
        .def("__truediv__", [](const Self&, nb::handle) -> Extent {
          throw nb::type_error("graphsafe: extents are integer counts: use // (floor) or graphsafe.ceil_div");
        });
  };
  arithmetic(ext);
  arithmetic(sym);

  m.def("ceil_div", [](const Extent& a, const Extent& b) { return ceil_div(a, b); }, "a"_a, "b"_a, "ceil(a / b)");
  m.def("floor_div", [](const Extent& a, const Extent& b) { return floor_div(a, b); }, "a"_a, "b"_a, "floor(a / b) (also a // b)");
  m.def("round_up", [](const Extent& a, const Extent& b) { return round_up(a, b); }, "a"_a, "multiple"_a);
  m.def("max", [](const Extent& a, const Extent& b) { return max(a, b); }, "a"_a, "b"_a, "The larger of two extents");
  m.def("min", [](const Extent& a, const Extent& b) { return min(a, b); }, "a"_a, "b"_a, "The smaller of two extents");
  auto fold = [](Symbol batch, nb::callable body, bool sum) {
    std::function<Extent(const Extent&)> f = [&body](const Extent& element) {
      return extent_of(body(element), "the body of sum_over/max_over");
    };
    return sum ? sum_over(batch, f) : max_over(batch, f);
  };
  m.def("sum_over", [fold](Symbol batch, nb::callable body) { return fold(batch, body, true); }, "batch"_a, "body"_a,
        "sum over the requests of a batch symbol of body(element), e.g. sum_over(L, lambda l: ceil_div(l, 4))");
  m.def("max_over", [fold](Symbol batch, nb::callable body) { return fold(batch, body, false); }, "batch"_a, "body"_a,
        "max over the requests of a batch symbol of body(element)");

  nb::class_<Bindings>(m, "Bindings",
                       "Current values of symbols: ints for fixed/dynamic symbols, one int per request for batch "
                       "symbols (lists, tuples, 1-d NumPy arrays or host tensors). Validated when set.")
      .def(nb::init<>())
      .def("__init__",
           [](Bindings* self, nb::dict values) {
             new (self) Bindings();
             for (auto [k, v] : values) set_value(*self, nb::cast<Symbol>(k), v);
           },
           "values"_a)
      .def("set", [](Bindings& b, Symbol s, nb::handle v) -> Bindings& { set_value(b, s, v); return b; },
           "symbol"_a, "value"_a, nb::rv_policy::reference)
      .def("__setitem__", [](Bindings& b, Symbol s, nb::handle v) { set_value(b, s, v); })
      .def("__getitem__", [](const Bindings& b, Symbol s) { return binding_value(b, s); })
      .def("__contains__", [](const Bindings& b, Symbol s) { return b.has(s); })
      .def("has", &Bindings::has, "symbol"_a)
      .def("value", &Bindings::value, "symbol"_a)
      .def("values", [](const Bindings& b, Symbol s) {
        auto v = b.values(s);
        return std::vector<std::int64_t>(v.begin(), v.end());
      }, "symbol"_a)
      .def("describe", &Bindings::describe, "symbol"_a)
      .def("copy", [](const Bindings& b) { return Bindings(b); })
      .def("__copy__", [](const Bindings& b) { return Bindings(b); });

  nb::class_<SizingDecision>(m, "SizingDecision", "A policy's answer: elements to reserve, whether no replay within "
                                                   "capacities can need more, and why")
      .def(nb::init<>())
      .def("__init__",
           [](SizingDecision* self, std::int64_t count, bool replay_safe, std::string note) {
             new (self) SizingDecision{count, replay_safe, std::move(note)};
           },
           "count"_a, "replay_safe"_a = false, "note"_a = "")
      .def_rw("count", &SizingDecision::count)
      .def_rw("replay_safe", &SizingDecision::replay_safe)
      .def_rw("note", &SizingDecision::note)
      .def("__repr__", [](const SizingDecision& d) {
        return "SizingDecision(count=" + std::to_string(d.count) + ", replay_safe=" + (d.replay_safe ? "True" : "False") +
               ", note='" + d.note + "')";
      });

  nb::class_<SizingPolicy, PySizingPolicy>(
      m, "SizingPolicy",
      "How many elements to reserve for a request whose need is an Extent. Subclass it to write one in Python: "
      "pass its name to __init__ and override size(request, need, bindings, capturing) -> SizingDecision. A "
      "decision that is not replay_safe is guarded before every replay.")
      .def("__init__", [](SizingPolicy* self, std::string name) { new (self) PySizingPolicy(std::move(name)); },
           "name"_a)
      .def_prop_ro("name", [](const SizingPolicy& p) { return std::string(p.name()); })
      .def("size",
           [](const SizingPolicy& p, const std::string& request, const Extent& need, nb::handle b, bool capturing) {
             Bindings storage;
             return p.size(request, need, bindings_arg(b, storage), capturing);
           },
           "request"_a, "need"_a, "bindings"_a, "capturing"_a = true)
      .def("__repr__", [](const SizingPolicy& p) { return "<graphsafe policy " + std::string(p.name()) + ">"; });
  nb::class_<CapacityBound, SizingPolicy>(m, "CapacityBound");
  nb::class_<ExactAtCapture, SizingPolicy>(m, "ExactAtCapture");
  nb::class_<StaticQueryBound, SizingPolicy>(m, "StaticQueryBound")
      .def(nb::init<Extent>(), "bound"_a)
      .def_prop_ro("bound", &StaticQueryBound::bound);
  m.attr("capacity_bound") = nb::cast(&capacity_bound, nb::rv_policy::reference);
  m.attr("exact_at_capture") = nb::cast(&exact_at_capture, nb::rv_policy::reference);
  m.def("static_query_bound", [](const Extent& bound) { return StaticQueryBound(bound); }, "bound"_a,
        "Reserve a bound written in fixed symbols only (e.g. tokens_in_graph * window)");

  nb::class_<GuardViolation>(m, "GuardViolation",
                             "One guard that does not hold for a replay's bindings: `required` elements needed, "
                             "`reserved` reserved by the capture for `request`.")
      .def_ro("request", &GuardViolation::request)
      .def_ro("policy", &GuardViolation::policy)
      .def_ro("site", &GuardViolation::site)
      .def_ro("required", &GuardViolation::required)
      .def_ro("reserved", &GuardViolation::reserved)
      .def_ro("symbols", &GuardViolation::symbols)
      .def("to_dict", [](const GuardViolation& g) {
        nb::dict d;
        d["request"] = g.request;
        d["policy"] = g.policy;
        d["site"] = g.site;
        d["required"] = g.required;
        d["reserved"] = g.reserved;
        d["symbols"] = g.symbols;
        return d;
      })
      .def("__repr__", [](const GuardViolation& g) {
        return "GuardViolation(request='" + g.request + "', required=" + std::to_string(g.required) +
               ", reserved=" + std::to_string(g.reserved) + ", policy='" + g.policy + "', site='" + g.site +
               "', symbols='" + g.symbols + "')";
      });
}

}  // namespace graphsafe::python
