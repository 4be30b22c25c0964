// DS4 sparse attention: the instrumentation policy of the warp-specialized kernel. The library
// instantiates the kernel with NoProbe only (every hook compiles to nothing); the attention
// benchmark's timeline build instantiates it with timeline.cuh's TimelineProbe, which stamps
// clock64 at the phase edges (kernels/ds4/timeline.hpp is the record layout).
//
//   Probe probe;  probe.begin();  probe.stamp(tl::full + (j & 7), tid == 0);
#pragma once

#include "../timeline.hpp"

namespace graphsafe::ds4::cuda::attention {

namespace tl = timeline;

struct NoProbe {
  __device__ __forceinline__ void begin() {}                        // after the prologue's loads
  __device__ __forceinline__ void tiles(int) {}                     // the CTA's tile count
  __device__ __forceinline__ void stamp(int, bool) {}               // slot, condition
  __device__ __forceinline__ void stamp_after(int, bool, unsigned) {}  // ... in program order after reg
  __device__ __forceinline__ void exit(bool) {}                     // output stores issued
};

}  // namespace graphsafe::ds4::cuda::attention
