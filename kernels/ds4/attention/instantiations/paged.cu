// The attention over the fp8 paged caches (paged-direct rows), as the library ships it.
#include "../launch.cuh"

namespace graphsafe::ds4::cuda::attention {
template void run<true, NoProbe>(Params&, const AttentionCommon&, const AttentionOptions&, cudaStream_t, const char*);
}  // namespace graphsafe::ds4::cuda::attention
