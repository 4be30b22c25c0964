// CudaVirtualMemory: the CUDA virtual memory management API (driver API). The driver functions
// are resolved at first use through the runtime (cudaGetDriverEntryPointByVersion) instead of
// linking libcuda: programs that link graphsafe then load on machines without a driver (CI) and
// GPU tests can skip instead of failing to start.
#include <graphsafe/cuda_backend.hpp>
#include <graphsafe/error.hpp>
#include <graphsafe/virtual_memory.hpp>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <string>

namespace graphsafe {

namespace {

#define GRAPHSAFE_DRIVER_FUNCTIONS(X)                                                                   \
  X(cuCtxGetCurrent) X(cuCtxSetCurrent) X(cuDeviceGet) X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRelease) \
  X(cuDevicePrimaryCtxRetain) X(cuGetErrorName) X(cuGetErrorString) X(cuMemAddressFree)                  \
  X(cuMemAddressReserve) X(cuMemCreate) X(cuMemGetAllocationGranularity) X(cuMemMap) X(cuMemRelease)       \
  X(cuMemSetAccess) X(cuMemUnmap)

struct DriverApi {
#define GRAPHSAFE_MEMBER(f) decltype(&f) p_##f = nullptr;
  GRAPHSAFE_DRIVER_FUNCTIONS(GRAPHSAFE_MEMBER)
#undef GRAPHSAFE_MEMBER
};

DriverApi load_driver_api() {
  DriverApi d;
#define GRAPHSAFE_LOAD(f)                                                                                   \
  {                                                                                                         \
    void* fp = nullptr;                                                                                     \
    cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;                               \
    const cudaError_t e = cudaGetDriverEntryPointByVersion(#f, &fp, 12000, cudaEnableDefault, &q);          \
    if (e != cudaSuccess || q != cudaDriverEntryPointSuccess || !fp) {                                      \
      cudaGetLastError();                                                                                   \
      throw cuda_error(std::string("graphsafe: virtual memory needs the CUDA driver function " #f            \
                                   ", which could not be resolved (") + cudaGetErrorString(e) +             \
                           "); run on a machine with an NVIDIA driver for CUDA >= 12, or turn "            \
                           "ArenaOptions::virtual_memory off",                                              \
                       static_cast<int>(e));                                                                \
    }                                                                                                       \
    d.p_##f = reinterpret_cast<decltype(d.p_##f)>(fp);                                                      \
  }
  GRAPHSAFE_DRIVER_FUNCTIONS(GRAPHSAFE_LOAD)
#undef GRAPHSAFE_LOAD
  return d;
}

const DriverApi& driver() {
  static const DriverApi d = load_driver_api();  // thread-safe, once
  return d;
}

}  // namespace

// From here on the driver calls go through the resolved pointers.
#undef cuDevicePrimaryCtxRelease
#define cuCtxGetCurrent driver().p_cuCtxGetCurrent
#define cuCtxSetCurrent driver().p_cuCtxSetCurrent
#define cuDeviceGet driver().p_cuDeviceGet
#define cuDeviceGetAttribute driver().p_cuDeviceGetAttribute
#define cuDevicePrimaryCtxRelease driver().p_cuDevicePrimaryCtxRelease
#define cuDevicePrimaryCtxRetain driver().p_cuDevicePrimaryCtxRetain
#define cuGetErrorName driver().p_cuGetErrorName
#define cuGetErrorString driver().p_cuGetErrorString
#define cuMemAddressFree driver().p_cuMemAddressFree
#define cuMemAddressReserve driver().p_cuMemAddressReserve
#define cuMemCreate driver().p_cuMemCreate
#define cuMemGetAllocationGranularity driver().p_cuMemGetAllocationGranularity
#define cuMemMap driver().p_cuMemMap
#define cuMemRelease driver().p_cuMemRelease
#define cuMemSetAccess driver().p_cuMemSetAccess
#define cuMemUnmap driver().p_cuMemUnmap

namespace {

void check_cu(CUresult r, const char* call, const char* what = nullptr) {
  if (r == CUDA_SUCCESS) return;
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName(r, &name) != CUDA_SUCCESS) name = "unknown CUresult";
  if (cuGetErrorString(r, &text) != CUDA_SUCCESS) text = "";
  std::string msg = std::string("graphsafe: CUDA driver call failed: ") + call + " -> " + name + " (" + text + ")";
  if (what) msg += std::string("; ") + what;
  if (r == CUDA_ERROR_OUT_OF_MEMORY) throw out_of_memory_error(msg);
  throw cuda_error(msg, static_cast<int>(r));
}
#define GRAPHSAFE_CU(call) check_cu((call), #call)

// Driver calls made while this thread (or, in global mode, any thread) captures must not be
// judged "unsafe" and invalidate the capture: none of them is stream-ordered, so none belongs in
// the graph. Exchange the thread's capture mode to relaxed around them (as PyTorch does).
class RelaxedCaptureMode {
 public:
  RelaxedCaptureMode() {
    mode_ = cudaStreamCaptureModeRelaxed;
    ok_ = cudaThreadExchangeStreamCaptureMode(&mode_) == cudaSuccess;
    if (!ok_) cudaGetLastError();
  }
  ~RelaxedCaptureMode() {
    if (ok_ && cudaThreadExchangeStreamCaptureMode(&mode_) != cudaSuccess) cudaGetLastError();
  }
  RelaxedCaptureMode(const RelaxedCaptureMode&) = delete;
  RelaxedCaptureMode& operator=(const RelaxedCaptureMode&) = delete;

 private:
  cudaStreamCaptureMode mode_;
  bool ok_ = false;
};

// The driver API needs a current context on the calling thread; a thread that only replays may
// never have made one current. Make the device's primary context current when none is.
void ensure_context(void* ctx) {
  CUcontext cur = nullptr;
  GRAPHSAFE_CU(cuCtxGetCurrent(&cur));
  if (!cur) GRAPHSAFE_CU(cuCtxSetCurrent(static_cast<CUcontext>(ctx)));
}

CUmemAllocationProp chunk_prop(int device, bool shareable = false) {
  CUmemAllocationProp p{};
  p.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  p.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  p.location.id = device;
  p.requestedHandleTypes = shareable ? CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR : CU_MEM_HANDLE_TYPE_NONE;
  return p;
}

int resolve_device(int d) {
  if (d >= 0) return d;
  int cur = 0;
  GRAPHSAFE_CUDA(cudaGetDevice(&cur));
  return cur;
}

}  // namespace

std::uint64_t CudaVirtualMemory::minimum_granularity(int device) { return query_granularity(resolve_device(device)); }
std::uint64_t CudaVirtualMemory::recommended_granularity(int device) {
  return query_granularity(resolve_device(device), true);
}

std::uint64_t CudaVirtualMemory::query_granularity(int device, bool recommended) {
  // Initialize the runtime's primary context for the device (driver calls below need the driver
  // initialized; cudaFree(0) does both).
  int prev = 0;
  GRAPHSAFE_CUDA(cudaGetDevice(&prev));
  GRAPHSAFE_CUDA(cudaSetDevice(device));
  GRAPHSAFE_CUDA(cudaFree(nullptr));
  CUdevice dev;
  GRAPHSAFE_CU(cuDeviceGet(&dev, device));
  int vmm = 0;
  GRAPHSAFE_CU(cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, dev));
  if (!vmm)
    throw error("graphsafe: device " + std::to_string(device) +
                " does not support CUDA virtual memory management; virtual growth is unavailable (use the "
                "ordinary arena: leave ArenaOptions::virtual_memory empty)");
  const CUmemAllocationProp prop = chunk_prop(device);
  size_t g = 0;
  GRAPHSAFE_CU(cuMemGetAllocationGranularity(
      &g, &prop, recommended ? CU_MEM_ALLOC_GRANULARITY_RECOMMENDED : CU_MEM_ALLOC_GRANULARITY_MINIMUM));
  if (prev != device) GRAPHSAFE_CUDA(cudaSetDevice(prev));
  if (g == 0) throw error("graphsafe: cuMemGetAllocationGranularity returned 0");
  return g;
}

CudaVirtualMemory::CudaVirtualMemory(CudaVirtualMemoryOptions o)
    : VirtualMemory(query_granularity(resolve_device(o.device))), opts_(o), device_(resolve_device(o.device)) {
  CUdevice dev;
  GRAPHSAFE_CU(cuDeviceGet(&dev, device_));
  CUcontext ctx = nullptr;
  GRAPHSAFE_CU(cuDevicePrimaryCtxRetain(&ctx, dev));
  ctx_ = ctx;
}

CudaVirtualMemory::~CudaVirtualMemory() {
  release_pool_noexcept();
  if (ctx_) {
    CUdevice dev;
    if (cuDeviceGet(&dev, device_) == CUDA_SUCCESS) cuDevicePrimaryCtxRelease(dev);
  }
}

std::uintptr_t CudaVirtualMemory::do_reserve(std::uint64_t bytes) {
  RelaxedCaptureMode relaxed;
  ensure_context(ctx_);
  CUdeviceptr p = 0;
  const CUresult r = cuMemAddressReserve(&p, bytes, granularity(), 0, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY || r == CUDA_ERROR_INVALID_VALUE)
    throw out_of_memory_error("graphsafe: cuMemAddressReserve could not reserve " + std::to_string(bytes) +
                              " bytes of address space; lower ArenaOptions::virtual_reserve_bytes");
  check_cu(r, "cuMemAddressReserve");
  return static_cast<std::uintptr_t>(p);
}

void CudaVirtualMemory::do_unreserve(std::uintptr_t va, std::uint64_t bytes) noexcept {
  RelaxedCaptureMode relaxed;
  try {
    ensure_context(ctx_);
  } catch (...) {
  }
  cuMemAddressFree(static_cast<CUdeviceptr>(va), bytes);
}

std::uint64_t CudaVirtualMemory::do_create_chunk() {
  if (opts_.limit_bytes && (live_chunks_ + 1) * granularity() > opts_.limit_bytes)
    throw out_of_memory_error("graphsafe: CUDA virtual memory cannot create a chunk: " +
                              std::to_string(live_chunks_ * granularity()) + " of its " +
                              std::to_string(opts_.limit_bytes) +
                              "-byte limit are held; shrink idle graphs or raise CudaVirtualMemoryOptions::limit_bytes");
  RelaxedCaptureMode relaxed;
  ensure_context(ctx_);
  const CUmemAllocationProp prop = chunk_prop(device_, opts_.shareable);
  CUmemGenericAllocationHandle h = 0;
  const CUresult r = cuMemCreate(&h, granularity(), &prop, 0);
  if (r == CUDA_ERROR_OUT_OF_MEMORY)
    throw out_of_memory_error("graphsafe: cuMemCreate could not provide a " + std::to_string(granularity()) +
                              "-byte chunk (CUDA_ERROR_OUT_OF_MEMORY); the device is full -- shrink idle graphs "
                              "(arena.shrink) or free memory; the replay was not launched");
  check_cu(r, "cuMemCreate");
  ++live_chunks_;
  return static_cast<std::uint64_t>(h);
}

void CudaVirtualMemory::do_release_chunk(std::uint64_t chunk) noexcept {
  RelaxedCaptureMode relaxed;
  cuMemRelease(static_cast<CUmemGenericAllocationHandle>(chunk));
  --live_chunks_;
}

void CudaVirtualMemory::do_map(std::uintptr_t va, std::uint64_t chunk) {
  RelaxedCaptureMode relaxed;
  ensure_context(ctx_);
  GRAPHSAFE_CU(cuMemMap(static_cast<CUdeviceptr>(va), granularity(), 0,
                        static_cast<CUmemGenericAllocationHandle>(chunk), 0));
}

void CudaVirtualMemory::do_set_access(std::uintptr_t va, std::uint64_t bytes) {
  RelaxedCaptureMode relaxed;
  ensure_context(ctx_);
  CUmemAccessDesc desc{};
  desc.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  desc.location.id = device_;
  desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  GRAPHSAFE_CU(cuMemSetAccess(static_cast<CUdeviceptr>(va), bytes, &desc, 1));
}

bool CudaVirtualMemory::do_unmap(std::uintptr_t va) noexcept {
  RelaxedCaptureMode relaxed;
  try {
    ensure_context(ctx_);
  } catch (...) {
    return false;
  }
  return cuMemUnmap(static_cast<CUdeviceptr>(va), granularity()) == CUDA_SUCCESS;
}

}  // namespace graphsafe
