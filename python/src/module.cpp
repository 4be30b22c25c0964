// The graphsafe Python extension: errors, call sites, streams; the rest is bound in model.cpp
// (symbols, extents, bindings, policies), arena.cpp (backends, arena, workspaces, capture) and
// debug.cpp (the debug report).
#include "common.hpp"

#include <Python.h>
#include <frameobject.h>

#include <bit>

namespace graphsafe::python {

PythonSite::PythonSite() {
  // Borrowed frame; no frame means a call from C (a callback run by a C++ thread).
  PyFrameObject* f = PyEval_GetFrame();
  if (!f) return;
  code_ = nb::steal(reinterpret_cast<PyObject*>(PyFrame_GetCode(f)));
  auto* code = reinterpret_cast<PyCodeObject*>(code_.ptr());
  // UTF-8 forms are cached inside the str objects, which the code object keeps alive.
  const char* file = PyUnicode_AsUTF8(code->co_filename);
  const char* function = PyUnicode_AsUTF8(code->co_name);
  if (!file || !function) {
    PyErr_Clear();
    return;
  }
  impl_ = Impl{file, function, static_cast<unsigned>(PyFrame_GetLineNumber(f)), 0};
}

std::source_location PythonSite::loc() const {
#if defined(__GNUC__) || defined(__clang__)
  // std::source_location is one pointer to a compiler-filled record; point it at ours.
  static_assert(sizeof(std::source_location) == sizeof(const Impl*));
  return std::bit_cast<std::source_location>(&impl_);
#else
  return std::source_location::current();
#endif
}

HostStream& default_host_stream() {
  static HostStream* s = new HostStream();  // leaked: outlives every arena at interpreter exit
  return *s;
}

namespace {

// torch's current raw stream for `device`, when torch is imported; nullopt otherwise.
std::optional<std::uintptr_t> torch_current_stream(int device) {
  PyObject* mods = PyImport_GetModuleDict();  // borrowed
  PyObject* torch = PyDict_GetItemString(mods, "torch");
  if (!torch) return std::nullopt;
  static nb::object raw;  // torch._C._cuda_getCurrentRawStream(device) -> int
  static bool looked = false;
  if (!looked) {
    looked = true;
    nb::object C = nb::getattr(nb::handle(torch), "_C", nb::none());
    if (!C.is_none()) raw = nb::getattr(C, "_cuda_getCurrentRawStream", nb::none());
    if (!raw.is_valid() || raw.is_none()) raw = nb::object();
  }
  if (raw.is_valid()) return nb::cast<std::uintptr_t>(raw(device));
  nb::object s = nb::handle(torch).attr("cuda").attr("current_stream")(device);
  return nb::cast<std::uintptr_t>(s.attr("cuda_stream"));
}

}  // namespace

Stream to_stream(const Backend& backend, nb::handle h) {
  const bool host = backend.name() == "host";
  if (h.is_none()) {
    if (host) return Stream(default_host_stream());
    int device = cuda_device_of(backend);
    if (auto s = torch_current_stream(device)) return Stream(reinterpret_cast<cudaStream_t>(*s));
    return Stream(cudaStream_t{nullptr});
  }
  if (HostStream* hs = nullptr; nb::try_cast<HostStream*>(h, hs) && hs) {
    if (!host)
      throw invalid_argument_error("graphsafe: a HostStream was passed to an arena on the '" + std::string(backend.name()) +
                                   "' backend; pass a CUDA stream (torch.cuda.Stream, an int handle) or None");
    return Stream(*hs);
  }
  if (host)
    throw invalid_argument_error("graphsafe: the host backend takes a graphsafe.HostStream (or None for the default one), not " +
                                 nb::cast<std::string>(nb::repr(h)));
  std::uintptr_t raw = 0;
  if (nb::try_cast<std::uintptr_t>(h, raw)) return Stream(reinterpret_cast<cudaStream_t>(raw));
  if (nb::hasattr(h, "cuda_stream")) return Stream(reinterpret_cast<cudaStream_t>(nb::cast<std::uintptr_t>(h.attr("cuda_stream"))));
  if (nb::hasattr(h, "__cuda_stream__")) {
    nb::tuple t = nb::cast<nb::tuple>(h.attr("__cuda_stream__")());
    return Stream(reinterpret_cast<cudaStream_t>(nb::cast<std::uintptr_t>(t[1])));
  }
  throw invalid_argument_error("graphsafe: cannot use " + nb::cast<std::string>(nb::repr(h)) +
                               " as a CUDA stream (expected None, an int handle, torch.cuda.Stream or an object with __cuda_stream__)");
}

}  // namespace graphsafe::python

NB_MODULE(_graphsafe, m) {
  using namespace graphsafe::python;
  m.doc() = "graphsafe: graph-safe GPU workspaces for CUDA Graph capture and replay (C++ core)";
  // A host graph's recorded closures hold Python callables whose globals often hold the graph: a
  // cycle through C++ that the cycle collector cannot see, so instances alive at interpreter exit
  // would be reported as leaks although nothing leaks while the program runs.
  nb::set_leak_warnings(false);
  bind_errors(m);
  bind_model(m);
  nb::module_ d = m.def_submodule("debug", "The debug report (findings) and its tools");
  bind_debug(d);
  bind_arena(m);
  bind_torch_backend(m);
  bind_torch_allocator(m);
#ifdef GRAPHSAFE_PYTHON_DS4
  bind_ds4(m);
#endif
}

namespace graphsafe::python {
namespace {

struct ErrorTypes {
  PyObject* error;
  PyObject* invalid_argument;
  PyObject* capacity;
  PyObject* unbound_symbol;
  PyObject* overflow;
  PyObject* policy_refusal;
  PyObject* capture_state;
  PyObject* out_of_memory;
  PyObject* cuda;
  PyObject* guard_failure;
};
ErrorTypes types{};

PyObject* new_error(nb::module_& m, const char* name, nb::handle bases, const char* doc) {
  std::string qualified = std::string("graphsafe.") + name;
  PyObject* t = PyErr_NewExceptionWithDoc(qualified.c_str(), doc, bases.ptr(), nullptr);
  if (!t) throw nb::python_error();
  m.attr(name) = nb::handle(t);
  return t;
}

// Raise `type(message)` with extra attributes set by `fill`.
template <class Fill>
void raise(PyObject* type, const char* message, Fill&& fill) {
  nb::object ex = nb::handle(type)(nb::str(message));
  fill(ex);
  PyErr_SetObject(type, ex.ptr());
}
void raise(PyObject* type, const char* message) {
  raise(type, message, [](nb::object&) {});
}

}  // namespace

void bind_errors(nb::module_& m) {
  nb::handle builtins = nb::module_::import_("builtins");
  auto tup = [](auto... h) { return nb::make_tuple(h...); };
  types.error = new_error(m, "Error", tup(builtins.attr("RuntimeError")), "Base of every error graphsafe raises.");
  nb::handle E(types.error);
  types.invalid_argument = new_error(m, "InvalidArgumentError", tup(E, builtins.attr("ValueError")),
                                     "A value outside its contract (negative length, zero alignment, ...).");
  types.capacity = new_error(m, "CapacityError", tup(nb::handle(types.invalid_argument)),
                             "A symbol was bound to a value above its declared capacity.");
  types.unbound_symbol = new_error(m, "UnboundSymbolError", tup(nb::handle(types.invalid_argument)),
                                   "An extent referenced a symbol the bindings do not define.");
  types.overflow = new_error(m, "SizeOverflowError", tup(E, builtins.attr("OverflowError")),
                             "A size or byte count does not fit in 64 bits.");
  types.policy_refusal = new_error(m, "PolicyRefusal", tup(E),
                                   "A sizing policy cannot give a replay-safe size (e.g. a dynamic symbol with no capacity).");
  types.capture_state = new_error(m, "CaptureStateError", tup(E), "A call made in the wrong capture state.");
  types.out_of_memory = new_error(m, "OutOfMemoryError", tup(E, builtins.attr("MemoryError")),
                                  "The arena (or its upstream) cannot provide the bytes asked for.");
  types.cuda = new_error(m, "CudaError", tup(E), "A CUDA call failed; `code` is the cudaError_t value.");
  types.guard_failure = new_error(m, "GuardFailure", tup(E),
                                  "A replay whose bindings need more than the graph reserved; raised before launch. "
                                  "`violations` lists each guard that failed.");

  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const guard_failure& e) {
      raise(types.guard_failure, e.what(), [&](nb::object& ex) {
        nb::list v;
        for (const GuardViolation& g : e.violations()) v.append(nb::cast(g));
        ex.attr("violations") = v;
      });
    } catch (const cuda_error& e) {
      raise(types.cuda, e.what(), [&](nb::object& ex) { ex.attr("code") = e.code(); });
    } catch (const capacity_error& e) {
      raise(types.capacity, e.what());
    } catch (const unbound_symbol_error& e) {
      raise(types.unbound_symbol, e.what());
    } catch (const invalid_argument_error& e) {
      raise(types.invalid_argument, e.what());
    } catch (const overflow_error& e) {
      raise(types.overflow, e.what());
    } catch (const policy_refusal& e) {
      raise(types.policy_refusal, e.what());
    } catch (const capture_state_error& e) {
      raise(types.capture_state, e.what());
    } catch (const out_of_memory_error& e) {
      raise(types.out_of_memory, e.what());
    } catch (const error& e) {
      raise(types.error, e.what());
    }
  });
}

}  // namespace graphsafe::python
