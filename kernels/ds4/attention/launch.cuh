// DS4 sparse attention: the launch of one layer's attention for a row source (kPaged) and an
// instrumentation policy (Probe), instantiated by instantiations/*.cu (NoProbe) and by the
// attention benchmark's timeline build (timeline.cuh).
//
//   engine: the ws kernel on a compute capability 9.x device unless the options ask for mma_sync;
//   merge:  2 or 4 splits merge in a thread-block cluster (ws, unless options.cluster_merge is
//           false or the device refused a cluster launch once), other counts through the scratch
//           and combine_splits_kernel.
#pragma once

#include "config.cuh"
#include "mma_sync_kernel.cuh"
#include "params.cuh"
#include "probe.cuh"
#include "ws_kernel.cuh"

#include <mutex>
#include <string>

namespace graphsafe::ds4::cuda::attention {

// Set once a cluster launch was refused (then every later launch merges through the scratch).
bool& cluster_refused();
// The compute capability major of the current device (cached per device).
int device_cc_major();

inline bool use_ws(const AttentionOptions& o) {
  const int major = device_cc_major();
  switch (o.engine) {
    case AttentionEngine::mma_sync: return false;
    case AttentionEngine::warp_specialized:
      if (major != 9)
        bad_arg("sparse_attention", "options.engine = warp_specialized on compute capability major", major,
                "9 (the kernel is sm_90a code); use automatic or mma_sync");
      return true;
    case AttentionEngine::automatic: break;
  }
  return major == 9;
}

template <bool kPaged, class Probe>
void set_smem_attribute() {
  static std::once_flag once[64];
  int dev = 0;
  check_cuda(cudaGetDevice(&dev), "cudaGetDevice");
  std::call_once(once[dev & 63], [] {
    check_cuda(cudaFuncSetAttribute(mma_sync_kernel<kPaged>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(sizeof(MmaSmem<kPaged>))),
               "cudaFuncSetAttribute(sparse_attention, max dynamic smem)");
    check_cuda(cudaFuncSetAttribute(ws_kernel<kPaged, Probe>, cudaFuncAttributeMaxDynamicSharedMemorySize, kWsSmemBytes),
               "cudaFuncSetAttribute(sparse_attention_ws, max dynamic smem)");
  });
}

template <bool kPaged, class Probe>
void run(Params& kp, const AttentionCommon& c, const AttentionOptions& options, cudaStream_t stream,
         const char* name) {
  set_smem_attribute<kPaged, Probe>();
  const dim3 grid(c.splits, c.batch, c.heads / kGroupHeads);
  kp.cluster = 0;
  if (use_ws(options)) {
    const auto kernel = ws_kernel<kPaged, Probe>;
    // The ws kernel merges in a cluster for 2 or 4 splits (heads dealt evenly to the ranks). Other
    // split counts: scratch + combine kernel.
    const bool cluster_ok = c.splits == 2 || c.splits == 4;
    cudaLaunchConfig_t cfg{};
    cfg.gridDim = grid;
    cfg.blockDim = dim3(kWsThreads);
    cfg.dynamicSmemBytes = kWsSmemBytes;
    cfg.stream = stream;
    cudaLaunchAttribute attr[2];
    attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr[0].val.programmaticStreamSerializationAllowed = 1;
    attr[1].id = cudaLaunchAttributeClusterDimension;
    attr[1].val.clusterDim.x = static_cast<unsigned>(c.splits);
    attr[1].val.clusterDim.y = 1;
    attr[1].val.clusterDim.z = 1;
    const int pdl = options.programmatic_launch ? 1 : 0;
    cfg.attrs = attr + 1 - pdl;
    if (cluster_ok && options.cluster_merge && !cluster_refused()) {
      // The splits of one (request, head group) form a cluster and merge over DSMEM (no scratch
      // traffic, no second kernel). If the device refuses the cluster shape, fall back for good.
      cfg.numAttrs = 1 + pdl;
      kp.cluster = 1;
      const cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, kp);
      if (err == cudaSuccess) {
        check_launch(name);
        return;
      }
      (void)cudaGetLastError();
      cluster_refused() = true;
      kp.cluster = 0;
    }
    cfg.attrs = attr;
    cfg.numAttrs = pdl;
    check_cuda(cudaLaunchKernelEx(&cfg, kernel, kp), name);
  } else {
    mma_sync_kernel<kPaged><<<grid, kThreads, sizeof(MmaSmem<kPaged>), stream>>>(kp);
  }
  check_launch(name);
  if (c.splits > 1) launch_combine(kp, c, stream);
}

}  // namespace graphsafe::ds4::cuda::attention
