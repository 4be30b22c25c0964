// Call-site frames for graphsafe_cupti findings: the caller's stack, symbolized, with the frames of
// the CUDA runtime, the driver, CUPTI and the tool itself told apart from the program's own.
//
//   auto frames = graphsafe::cupti::detail::symbolize(pcs, n);   // pcs from ::backtrace()
//   std::size_t site = graphsafe::cupti::detail::first_outside_runtime(frames, "cudaMemcpy", self_base);
//   frames[site].describe()   // "read_a_count() at /src/app.cu:42"
//
// nvcc links the CUDA runtime statically by default: its frames then live inside the executable
// itself, so they cannot be told apart by module. They are recognised by name instead (the API
// entry points cuda* / cu*, __cuda* registration helpers, the archive's internal libcudart_static_*
// symbols) and, where the runtime's local symbols have no name that the symbolizer can see (an
// executable with debug info for its own code only), as the unnamed frames that follow runtime
// frames: the first *named* frame outside the runtime is the call site, which keys a finding.
//
// Names come from the executable's debug info and symbol table through Boost.Stacktrace's
// libbacktrace backend when it was found at configure time (GRAPHSAFE_CUPTI_HAVE_BACKTRACE), else
// from dladdr, which names only exported functions (link the program with -rdynamic).
#pragma once

#ifdef GRAPHSAFE_CUPTI_HAVE_BACKTRACE
#define BOOST_STACKTRACE_LINK
#include <boost/stacktrace/frame.hpp>
#endif

#include <cxxabi.h>
#include <dlfcn.h>

#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace graphsafe::cupti::detail {

struct Frame {
  std::uintptr_t pc = 0;
  std::string function;  // demangled; empty when no symbolizer could name it
  std::string file;      // source file from debug info ("" if none)
  std::size_t line = 0;
  std::string module;    // path of the loaded object holding pc
  const void* module_base = nullptr;
  std::uintptr_t offset = 0;  // pc - module base

  // "fn at file:line", else "fn (module+0xoff)", else "?? (module+0xoff)".
  std::string describe() const {
    std::string fn = function.empty() ? std::string("??") : function;
    if (fn.size() > 240) fn = fn.substr(0, 237) + "...";
    if (!file.empty() && line) return fn + " at " + file + ":" + std::to_string(line);
    const char* slash = std::strrchr(module.c_str(), '/');
    char off[32];
    std::snprintf(off, sizeof off, "+0x%" PRIxPTR, offset);
    return fn + " (" + (slash ? slash + 1 : module.empty() ? "?" : module.c_str()) + off + ")";
  }
};

inline bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }

// A function of the CUDA runtime or driver, by name: cudaMalloc, cudaMemcpy_ptds, cuMemAlloc_v2,
// __cudaPushCallConfiguration, libcudart_static_<hash> (the static archive's internal functions),
// cudart::... The runtime's inline C++ wrappers (cudaMalloc<T>) count too: the caller is the site.
inline bool runtime_function(std::string_view name) {
  if (starts_with(name, "libcudart_static_") || starts_with(name, "__cuda") || starts_with(name, "cudart::") ||
      starts_with(name, "libcuda_"))
    return true;
  auto upper_after = [&](std::string_view prefix) {
    return starts_with(name, prefix) && name.size() > prefix.size() && name[prefix.size()] >= 'A' &&
           name[prefix.size()] <= 'Z';
  };
  return upper_after("cuda") || upper_after("cu");
}

// A loaded object of the CUDA stack, by file name: the driver, the shared runtime, CUPTI.
inline bool runtime_module(std::string_view path) {
  const auto slash = path.rfind('/');
  const std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
  return starts_with(base, "libcuda.so") || starts_with(base, "libcudart.so") || starts_with(base, "libcupti") ||
         starts_with(base, "libnvidia-") || starts_with(base, "libgraphsafe_cupti");
}

// The C and C++ runtime libraries: the CUDA runtime calls through them (pthread_once around its
// lazy initialization), so one of their frames is never taken for the call site.
inline bool system_module(std::string_view path) {
  const auto slash = path.rfind('/');
  const std::string_view base = slash == std::string_view::npos ? path : path.substr(slash + 1);
  for (std::string_view p : {"libc.so", "libc-", "libpthread", "libstdc++", "libgcc_s", "ld-linux", "libdl", "librt",
                             "libm.so"})
    if (starts_with(base, p)) return true;
  return false;
}

inline std::string demangle(const char* s) {
  if (!s || !*s) return {};
  int status = 0;
  char* d = abi::__cxa_demangle(s, nullptr, nullptr, &status);
  std::string out = (status == 0 && d) ? d : s;
  std::free(d);
  return out;
}

// Whether names come from debug info and symbol tables (libbacktrace) or from dladdr only.
inline constexpr bool full_symbolizer() {
#ifdef GRAPHSAFE_CUPTI_HAVE_BACKTRACE
  return true;
#else
  return false;
#endif
}

// Symbolize return addresses (as ::backtrace() gives them). Lookups use pc - 1 for every frame but
// the first, so a call that is the last instruction of its function names that function and line.
inline std::vector<Frame> symbolize(void* const* pcs, int n) {
  std::vector<Frame> out;
  out.reserve(n > 0 ? static_cast<std::size_t>(n) : 0);
  for (int i = 0; i < n; ++i) {
    Frame f;
    f.pc = reinterpret_cast<std::uintptr_t>(pcs[i]);
    const std::uintptr_t look = i == 0 ? f.pc : f.pc - 1;
    Dl_info info{};
    if (dladdr(reinterpret_cast<void*>(look), &info)) {
      if (info.dli_fname) f.module = info.dli_fname;
      f.module_base = info.dli_fbase;
      f.offset = f.pc - reinterpret_cast<std::uintptr_t>(info.dli_fbase);
      if (info.dli_sname) f.function = demangle(info.dli_sname);
    }
#ifdef GRAPHSAFE_CUPTI_HAVE_BACKTRACE
    // Not for the CUDA stack's own libraries: their debug info is absent and the lookup is slow.
    if (!runtime_module(f.module)) {
      const boost::stacktrace::frame bf(reinterpret_cast<const void*>(look));
      if (f.function.empty()) f.function = bf.name();
      f.file = bf.source_file();
      f.line = bf.source_line();
    }
#endif
    out.push_back(std::move(f));
  }
  return out;
}

// Index of the call site: the first named frame, past `skip` frames, that is neither in a module of
// the CUDA stack (nor in `self_base`, the tool's own module) nor a runtime function by name, nor in
// the C / C++ runtime libraries. Unnamed frames are taken as the runtime's (a statically linked
// runtime's local symbols). When no frame qualifies, the first frame after the last runtime frame;
// frames.size() if none.
inline std::size_t first_outside_runtime(const std::vector<Frame>& frames, std::string_view api,
                                         const void* self_base = nullptr, std::size_t skip = 0) {
  std::size_t last_runtime = frames.size();
  for (std::size_t i = skip; i < frames.size(); ++i) {
    const Frame& f = frames[i];
    const bool runtime = (self_base && f.module_base == self_base) || runtime_module(f.module) ||
                         runtime_function(f.function) || (!api.empty() && f.function == api);
    if (runtime) {
      last_runtime = i;
      continue;
    }
    if (!f.function.empty() && !system_module(f.module)) return i;
  }
  if (last_runtime == frames.size()) return skip < frames.size() ? skip : frames.size();
  return last_runtime + 1;
}

}  // namespace graphsafe::cupti::detail
