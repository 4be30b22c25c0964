// NCCL's registration calls, the ChunkRegistrar attachment and collectives over whole workspaces.
#include <graphsafe/error.hpp>
#include <graphsafe/nccl/nccl.hpp>

#include <string>
#include <vector>

namespace graphsafe::nccl {

#if defined(NCCL_VERSION_CODE) && NCCL_VERSION_CODE >= NCCL_VERSION(2, 27, 3)
#define GRAPHSAFE_NCCL_HAS_WINDOW 1
#else
#define GRAPHSAFE_NCCL_HAS_WINDOW 0
#endif

void check(ncclResult_t r, const char* call, ncclComm_t comm) {
  if (r == ncclSuccess) return;
  std::string msg = std::string("graphsafe::nccl: ") + call + " failed: " + ncclGetErrorString(r);
  const char* last = ncclGetLastError(comm);
  if (last && *last) msg += std::string(" (") + last + ")";
  throw error(msg);
}

int loaded_version() {
  int v = 0;
  check(ncclGetVersion(&v), "ncclGetVersion");
  return v;
}

bool window_registration_available() {
#if GRAPHSAFE_NCCL_HAS_WINDOW
  return loaded_version() >= NCCL_VERSION(2, 27, 3);
#else
  return false;
#endif
}

namespace {

class NcclCalls final : public RegistrationCalls {
 public:
  NcclCalls(ncclComm_t comm, bool window) : comm_(comm), window_(window) {}
  std::string kind() const override { return window_ ? "ncclCommWindowRegister" : "ncclCommRegister"; }
  void* register_range(void* p, std::uint64_t bytes) override {
#if GRAPHSAFE_NCCL_HAS_WINDOW
    if (window_) {
      ncclWindow_t w = nullptr;
      check(ncclCommWindowRegister(comm_, p, bytes, &w, NCCL_WIN_COLL_SYMMETRIC), "ncclCommWindowRegister", comm_);
      return w;
    }
#endif
    void* h = nullptr;
    check(ncclCommRegister(comm_, p, bytes, &h), "ncclCommRegister", comm_);
    return h;
  }
  bool deregister(void* handle) noexcept override {
    if (!handle) return true;  // NCCL registered nothing (e.g. registration disabled): nothing to give back
#if GRAPHSAFE_NCCL_HAS_WINDOW
    if (window_) return ncclCommWindowDeregister(comm_, static_cast<ncclWindow_t>(handle)) == ncclSuccess;
#endif
    return ncclCommDeregister(comm_, handle) == ncclSuccess;
  }

 private:
  ncclComm_t comm_;
  bool window_;
};

}  // namespace

std::unique_ptr<RegistrationCalls> nccl_registration(ncclComm_t comm, Registration kind) {
  if (!comm) throw invalid_argument_error("graphsafe::nccl: nccl_registration with a null communicator");
  bool window = false;
  switch (kind) {
    case Registration::automatic:
      window = window_registration_available();
      break;
    case Registration::window:
      if (!window_registration_available())
        throw invalid_argument_error("graphsafe::nccl: Registration::window needs NCCL 2.27.3 or later; built against " +
                                     std::to_string(NCCL_VERSION_CODE) + ", loaded " +
                                     std::to_string(loaded_version()) + "; use Registration::local");
      window = true;
      break;
    case Registration::local:
      break;
  }
  return std::make_unique<NcclCalls>(comm, window);
}

std::shared_ptr<ChunkRegistrar> attach_nccl(VirtualMemory& vm, ncclComm_t comm, RegistrarOptions options,
                                            Registration kind) {
  auto reg = std::make_shared<ChunkRegistrar>(nccl_registration(comm, kind), vm.granularity(), options);
  vm.set_listener(reg);
  return reg;
}

std::uint64_t element_bytes(ncclDataType_t type) {
  switch (type) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      break;
  }
  throw invalid_argument_error("graphsafe::nccl: data type " + std::to_string(static_cast<int>(type)) +
                               " has no known element size");
}

namespace {
int comm_size(ncclComm_t comm) {
  int n = 0;
  check(ncclCommCount(comm, &n), "ncclCommCount", comm);
  return n;
}
std::uint64_t elements_of(const Workspace& w, std::uint64_t eb, const char* what) {
  if (!w) throw invalid_argument_error(std::string("graphsafe::nccl: the ") + what + " workspace is empty");
  if (w.bytes() % eb != 0)
    throw invalid_argument_error(std::string("graphsafe::nccl: the ") + what + " workspace holds " +
                                 std::to_string(w.bytes()) + " bytes, not a multiple of the " + std::to_string(eb) +
                                 "-byte element");
  return w.bytes() / eb;
}
// What a failing collective over a workspace most often means in virtual mode.
std::string collective_call(const char* call) {
  return std::string(call) +
         " (over whole workspaces: under capture every byte of their reservations must be mapped -- in "
         "virtual mode request them with a footprint covering the reservation, Footprint::prefix)";
}
}  // namespace

void all_gather(const Workspace& send, const Workspace& recv, ncclDataType_t type, ncclComm_t comm,
                cudaStream_t stream) {
  const std::uint64_t eb = element_bytes(type);
  const std::uint64_t n = elements_of(send, eb, "all_gather send");
  const std::uint64_t ranks = static_cast<std::uint64_t>(comm_size(comm));
  if (recv.bytes() < n * ranks * eb)
    throw invalid_argument_error("graphsafe::nccl: all_gather of " + std::to_string(send.bytes()) + " bytes per rank over " +
                                 std::to_string(ranks) + " ranks needs a receive workspace of " +
                                 std::to_string(n * ranks * eb) + " bytes; it holds " + std::to_string(recv.bytes()));
  const ncclResult_t r = ncclAllGather(send.data(), recv.data(), n, type, comm, stream);
  if (r != ncclSuccess) check(r, collective_call("ncclAllGather").c_str(), comm);
}

void all_reduce(const Workspace& send, const Workspace& recv, ncclDataType_t type, ncclRedOp_t op, ncclComm_t comm,
                cudaStream_t stream) {
  const std::uint64_t eb = element_bytes(type);
  const std::uint64_t n = elements_of(send, eb, "all_reduce send");
  if (recv.bytes() < send.bytes())
    throw invalid_argument_error("graphsafe::nccl: all_reduce of " + std::to_string(send.bytes()) +
                                 " bytes needs a receive workspace of as many; it holds " + std::to_string(recv.bytes()));
  const ncclResult_t r = ncclAllReduce(send.data(), recv.data(), n, type, op, comm, stream);
  if (r != ncclSuccess) check(r, collective_call("ncclAllReduce").c_str(), comm);
}

LocalComms::LocalComms(int nranks) : n_(nranks) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess) devices = 0;
  if (nranks < 1 || nranks > devices)
    throw invalid_argument_error("graphsafe::nccl: LocalComms of " + std::to_string(nranks) + " ranks; this machine has " +
                                 std::to_string(devices) + " GPU(s): 1 to " + std::to_string(devices) + " ranks");
  comms_ = new ncclComm_t[nranks]();
  try {
    if (nranks == 1) {
      ncclUniqueId id;
      check(ncclGetUniqueId(&id), "ncclGetUniqueId");
      check(ncclCommInitRank(&comms_[0], 1, id, 0), "ncclCommInitRank");
    } else {
      std::vector<int> devs(nranks);
      for (int i = 0; i < nranks; ++i) devs[i] = i;
      check(ncclCommInitAll(comms_, nranks, devs.data()), "ncclCommInitAll");
    }
  } catch (...) {
    delete[] comms_;
    throw;
  }
}

LocalComms::~LocalComms() {
  for (int i = 0; i < n_; ++i)
    if (comms_[i]) ncclCommDestroy(comms_[i]);
  delete[] comms_;
}

}  // namespace graphsafe::nccl
