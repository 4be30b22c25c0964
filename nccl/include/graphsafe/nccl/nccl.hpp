// graphsafe::nccl -- NCCL over arena workspaces (optional library; built when CMake finds NCCL,
// docs/tensor_parallel.md):
//
//   auto reg = graphsafe::nccl::attach_nccl(*vm, comm);   // every chunk of vm registered once
//   graphsafe::Arena arena(backend, {.virtual_memory = vm});
//   auto g = graphsafe::capture(arena, s, b, [&](const graphsafe::Bindings& bb) {
//     auto part = arena.request(s, "tp.part", rows * hidden, 2, bucket, bb, whole_bucket);
//     auto full = arena.request(s, "tp.full", rows * hidden * world, 2, bucket_all, bb, whole_bucket_all);
//     ...                                                    // kernels write `part`
//     graphsafe::nccl::all_gather(part, full, ncclBfloat16, comm, s);  // inside the graph
//   });
//   reg->flush();                                            // chunks mapped during the capture
//   g.replay(grown, s);                                      // guards cover part and full
//
// The collectives run over whole workspaces: a captured collective's element count is fixed at
// capture, so it covers what the policy reserved (Workspace::bytes), and a replay whose bindings
// need more than that is refused by the plan's guards before launch, like any request's. In
// virtual mode the collective touches the whole reservation at every replay, so request its
// workspaces with that footprint (Footprint::prefix of the bucket): the capture maps all of it
// (NCCL's captured copies are checked against mapped memory) and the registrar registers it.
#pragma once

#include <graphsafe/nccl/registrar.hpp>
#include <graphsafe/virtual_memory.hpp>
#include <graphsafe/workspace.hpp>

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <cstdint>
#include <memory>
#include <string>

namespace graphsafe::nccl {

// Throws graphsafe::error naming the call, NCCL's error string and its last error message.
void check(ncclResult_t r, const char* call, ncclComm_t comm = nullptr);

// Which NCCL registration call registers a chunk.
enum class Registration {
  automatic,  // window where both the headers and the loaded library have it (2.27.3+), else local
  window,     // ncclCommWindowRegister(..., NCCL_WIN_COLL_SYMMETRIC): collective, every rank in order
  local,      // ncclCommRegister
};
// True when ncclCommWindowRegister was compiled in and the loaded library has it.
bool window_registration_available();
// The loaded library's version code (ncclGetVersion), e.g. 23203 for 2.32.3.
int loaded_version();

// NCCL's registration calls on `comm` (the communicator must outlive what uses them).
std::unique_ptr<RegistrationCalls> nccl_registration(ncclComm_t comm, Registration kind = Registration::automatic);

// Registers `vm`'s chunks with `comm` from now on: a ChunkRegistrar set as vm's listener. Attach
// before the memory serves an arena. The registrar is shared with vm; comm must outlive both (or
// call vm.set_listener(nullptr) before destroying it).
std::shared_ptr<ChunkRegistrar> attach_nccl(VirtualMemory& vm, ncclComm_t comm, RegistrarOptions options = {},
                                            Registration kind = Registration::automatic);

// The element size of an NCCL data type (invalid_argument_error for an unknown one).
std::uint64_t element_bytes(ncclDataType_t type);

// ncclAllGather over whole workspaces: `send` holds count elements of `type` (its bytes), `recv`
// nranks times as many. Checks the sizes (invalid_argument_error naming both) and enqueues on
// `stream` (inside a capture: a node of the graph).
void all_gather(const Workspace& send, const Workspace& recv, ncclDataType_t type, ncclComm_t comm,
                cudaStream_t stream);
// ncclAllReduce over whole workspaces of equal size (`recv` may be `send`: in place).
void all_reduce(const Workspace& send, const Workspace& recv, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                cudaStream_t stream);

// A one-process communicator of `nranks` ranks on devices 0..nranks-1 (ncclCommInitAll), for tests
// and benchmarks; destroys its communicators.
class LocalComms {
 public:
  explicit LocalComms(int nranks);
  ~LocalComms();
  LocalComms(const LocalComms&) = delete;
  LocalComms& operator=(const LocalComms&) = delete;
  int size() const { return n_; }
  ncclComm_t operator[](int rank) const { return comms_[rank]; }

 private:
  int n_ = 0;
  ncclComm_t* comms_ = nullptr;
};

}  // namespace graphsafe::nccl
