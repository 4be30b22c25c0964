// graphsafe_cupti's call sites on the CPU (tools/cupti/frames.hpp): the frames of a statically linked
// CUDA runtime live inside the executable, so they must be recognised by name, and two calls of one
// API from different functions must give two sites. Stand-ins named like the static runtime's
// functions (an API entry point and an internal libcudart_static_<hash> function) sit between the
// callers and the stack capture, in an executable that exports nothing (no -rdynamic).
#include <catch2/catch.hpp>

#include "frames.hpp"

#include <execinfo.h>

#include <string>
#include <vector>

using graphsafe::cupti::detail::first_outside_runtime;
using graphsafe::cupti::detail::Frame;
using graphsafe::cupti::detail::runtime_function;
using graphsafe::cupti::detail::symbolize;

#define NOINLINE __attribute__((noinline))
// Keeps a call from being a tail call (its frame would vanish from the stack).
#define NO_TAIL_CALL() asm volatile("" ::: "memory")

extern "C" NOINLINE void libcudart_static_4f2a9c0d17(std::vector<Frame>* out) {
  void* pcs[64];
  const int n = ::backtrace(pcs, 64);
  *out = symbolize(pcs, n);
  NO_TAIL_CALL();
}

extern "C" NOINLINE void cudaMemcpyStandIn(std::vector<Frame>* out) {
  libcudart_static_4f2a9c0d17(out);
  NO_TAIL_CALL();
}

NOINLINE void reads_the_count(std::vector<Frame>* out) {
  cudaMemcpyStandIn(out);
  NO_TAIL_CALL();
}

NOINLINE void reads_the_offsets(std::vector<Frame>* out) {
  cudaMemcpyStandIn(out);
  NO_TAIL_CALL();
}

static std::string all(const std::vector<Frame>& fs) {
  std::string s;
  for (const auto& f : fs) s += "  " + f.describe() + "\n";
  return s;
}

TEST_CASE("cupti frames: runtime functions are told from the program's by name", "[cupti][frames]") {
  for (const char* n : {"cudaMalloc", "cudaMemcpy_ptds", "cuMemAlloc_v2", "cuStreamSynchronize",
                        "__cudaPushCallConfiguration", "libcudart_static_0053c1d33059ebe9", "cudart::globalState"})
    CHECK(runtime_function(n));
  for (const char* n : {"main", "cuda::std::__4::min<int>", "custom_op", "curand_uniform", "cudnn_wrapper",
                        "gs_case_relaxed_malloc(Ctx&, bool)", "thrust::cuda_cub::malloc", ""})
    CHECK_FALSE(runtime_function(n));
}

TEST_CASE("cupti frames: the site skips unnamed static-runtime frames and lands on the first named caller",
          "[cupti][frames]") {
  auto fr = [](std::string fn, std::string module) {
    Frame f;
    f.function = std::move(fn);
    f.module = std::move(module);
    return f;
  };
  const char* app = "/opt/app/engine";
  // A callback inside CUPTI and the driver, then the static runtime's local (unnamed) functions,
  // its API entry point, an unnamed frame, the caller.
  std::vector<Frame> fs{fr("graphsafe::cupti::callback", "/x/libgraphsafe_cupti.so"), fr("", "/x/libcupti.so.13"),
                        fr("", "/usr/lib/libcuda.so.1"),  fr("", app),
                        fr("", app),                      fr("cudaMemcpy", app),
                        fr("", app),                      fr("read_count(int*)", app),
                        fr("main", app)};
  CHECK(first_outside_runtime(fs, "cudaMemcpy") == 7);
  // The runtime's lazy initialization runs under pthread_once (libc): not the site.
  std::vector<Frame> init{fr("", "/usr/lib/libcuda.so.1"), fr("", app), fr("__pthread_once_slow", "/lib/libc.so.6"),
                          fr("", app), fr("cudaMalloc", app), fr("step()", app)};
  CHECK(first_outside_runtime(init, "cudaMalloc") == 5);
  // Nothing named outside the runtime (a stripped program): the frame after the last runtime one.
  std::vector<Frame> stripped{fr("", "/usr/lib/libcuda.so.1"), fr("cudaMemcpy", app), fr("", app), fr("", app)};
  CHECK(first_outside_runtime(stripped, "cudaMemcpy") == 2);
  // The tool's own module is skipped by its base address whatever its frames are called.
  std::vector<Frame> own{fr("helper", "/x/libtool.so"), fr("caller", app)};
  own[0].module_base = reinterpret_cast<const void*>(0x1000);
  CHECK(first_outside_runtime(own, "", reinterpret_cast<const void*>(0x1000)) == 1);
}

TEST_CASE("cupti frames: two calls of one API from different functions give two sites that name them",
          "[cupti][frames]") {
  std::vector<Frame> a, b;
  reads_the_count(&a);
  reads_the_offsets(&b);
  INFO("stack of the first call:\n" << all(a) << "stack of the second call:\n" << all(b));
  REQUIRE(a.size() >= 4);
  const std::size_t ia = first_outside_runtime(a, "cudaMemcpyStandIn");
  const std::size_t ib = first_outside_runtime(b, "cudaMemcpyStandIn");
  REQUIRE(ia < a.size());
  REQUIRE(ib < b.size());
  // The stand-ins (runtime by name, not exported) are skipped: the sites are the two callers.
  CHECK(a[ia].function.find("reads_the_count") != std::string::npos);
  CHECK(b[ib].function.find("reads_the_offsets") != std::string::npos);
  CHECK(a[ia].describe() != b[ib].describe());
  // From the executable's debug info: the file and line of the call.
  REQUIRE(graphsafe::cupti::detail::full_symbolizer());
  CHECK_THAT(a[ia].describe(), Catch::Contains("test_cupti_frames.cpp:"));
  CHECK(a[ia].line > 0);
}
