// Shared by the translation units of the graphsafe Python extension.
#pragma once

#include <graphsafe/graphsafe.hpp>

#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <source_location>
#include <string>

namespace graphsafe::python {

namespace nb = nanobind;

void bind_errors(nb::module_& m);
void bind_model(nb::module_& m);
void bind_arena(nb::module_& m);
void bind_debug(nb::module_& m);
void bind_torch_backend(nb::module_& m);
void bind_torch_allocator(nb::module_& m);
void bind_ds4(nb::module_& m);  // graphsafe._graphsafe.ds4, when built with the DS4 kernels
// Whether the exported torch allocator serves an arena on this backend (graphsafe.torch_mem_pool).
bool torch_allocator_serves(const Backend& backend);

// The innermost Python frame of the current call (file, line, function), so plans, guard
// violations and debug findings name the engine's Python line rather than the binding's C++ line.
// `loc()` is valid while this object lives (the arena copies the site into a string at once).
class PythonSite {
 public:
  PythonSite();
  std::source_location loc() const;

 private:
  nb::object code_;  // keeps the file and function names (UTF-8, cached by the strings) alive
  struct Impl {      // the layout __builtin_source_location fills (GCC and Clang)
    const char* file;
    const char* function;
    unsigned line;
    unsigned column;
  } impl_{"<python>", "<unknown>", 0, 0};
};

// Bindings from a Bindings object, a dict {Symbol: int | sequence | array | tensor} or None.
Bindings to_bindings(nb::handle h);
// The same without a copy when `h` is a Bindings object (hot paths: request, replay); other inputs
// are converted into `storage`.
const Bindings& bindings_arg(nb::handle h, Bindings& storage);
// Stream for a backend from None (torch's current stream on CUDA when torch is imported, else the
// default stream; the process' default HostStream on the host backend), a HostStream, an int
// (cudaStream_t), an object with `cuda_stream` (torch.cuda.Stream) or `__cuda_stream__`.
Stream to_stream(const Backend& backend, nb::handle h);
HostStream& default_host_stream();
// The CUDA device of a CUDA or torch-cuda backend; -1 for the host backend.
int cuda_device_of(const Backend& backend);
// The debug report's findings as dicts {kind, request, graph, site, message, fix, count}.
nb::list finding_list(const std::vector<debug::Finding>& v);

}  // namespace graphsafe::python
