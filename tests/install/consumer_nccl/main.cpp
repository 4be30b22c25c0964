// Consumer of the installed graphsafe::nccl (find_package(graphsafe COMPONENTS nccl)). Collectives
// and registrations need a GPU, so this checks what runs without one: the NCCL it runs is the one
// whose header it compiled with, window registration is there exactly when both the package and the
// loaded NCCL have it, the element sizes of NCCL's types, and the size checks of the collectives on
// host-arena workspaces (refused before NCCL is called, with the sizes named). The registrar's own
// check is registrar.cpp.
#include <graphsafe/graphsafe.hpp>
#include <graphsafe/nccl/nccl.hpp>

#include <cstdint>
#include <cstdio>
#include <string>

using namespace graphsafe;

int check_registrar();  // registrar.cpp: failed checks

namespace {
int failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL: %s\n", what.c_str());
    ++failures;
  }
}
// Runs f, which must throw E whose message contains every one of `words`.
template <class E, class F>
void expect_throw(F f, const std::string& what, std::initializer_list<const char*> words) {
  try {
    f();
    expect(false, what + ": no exception");
  } catch (const E& e) {
    std::printf("refused as expected: %s\n", e.what());
    for (const char* w : words) expect(std::string(e.what()).find(w) != std::string::npos, what + ": names " + w);
  }
}
}  // namespace

int main() {
  const int loaded = nccl::loaded_version();
  std::printf("NCCL: header %d, loaded %d\n", NCCL_VERSION_CODE, loaded);
  expect(loaded == NCCL_VERSION_CODE, "the loaded NCCL is the one found at configure");
  expect(nccl::window_registration_available() == (BUILT_WITH_WINDOW && loaded >= NCCL_VERSION(2, 27, 3)),
         "window registration available exactly when built in and loaded");

  expect(nccl::element_bytes(ncclUint8) == 1, "ncclUint8: 1 byte");
  expect(nccl::element_bytes(ncclBfloat16) == 2, "ncclBfloat16: 2 bytes");
  expect(nccl::element_bytes(ncclFloat32) == 4, "ncclFloat32: 4 bytes");
  expect(nccl::element_bytes(ncclInt64) == 8, "ncclInt64: 8 bytes");
  expect_throw<invalid_argument_error>([] { nccl::element_bytes(static_cast<ncclDataType_t>(99)); },
                                       "element_bytes of type 99", {"99"});
  expect_throw<invalid_argument_error>([] { nccl::nccl_registration(nullptr); }, "a null communicator",
                                       {"null communicator"});
  expect_throw<error>([] { nccl::check(ncclInvalidArgument, "ncclSomething"); }, "check",
                      {"ncclSomething", ncclGetErrorString(ncclInvalidArgument)});

  HostBackend backend;
  Arena arena(backend, ArenaOptions{.report_findings = false});
  HostStream s;
  const Bindings b;
  auto send = arena.request(s, "send", Extent(1024), 1, capacity_bound, b);
  auto recv = arena.request(s, "recv", Extent(512), 1, capacity_bound, b);
  auto odd = arena.request(s, "odd", Extent(6), 1, capacity_bound, b);
  expect(send.bytes() == 1024 && recv.bytes() == 512 && odd.bytes() == 6, "host workspaces of 1024, 512, 6 bytes");
  expect_throw<invalid_argument_error>(
      [&] { nccl::all_reduce(send, recv, ncclFloat32, ncclSum, nullptr, nullptr); }, "all_reduce into less",
      {"1024", "512"});
  expect_throw<invalid_argument_error>(
      [&] { nccl::all_gather(odd, recv, ncclFloat32, nullptr, nullptr); }, "all_gather of 6 bytes of float",
      {"6 bytes", "4-byte"});
  expect_throw<invalid_argument_error>(
      [&] { nccl::all_gather(Workspace{}, recv, ncclFloat32, nullptr, nullptr); }, "all_gather of nothing",
      {"empty"});

  failures += check_registrar();
  std::printf("install consumer (nccl): %s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
