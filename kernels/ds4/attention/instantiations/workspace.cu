// The attention over the bf16 gather workspace, as the library ships it.
#include "../launch.cuh"

namespace graphsafe::ds4::cuda::attention {
template void run<false, NoProbe>(Params&, const AttentionCommon&, const AttentionOptions&, cudaStream_t, const char*);
}  // namespace graphsafe::ds4::cuda::attention
