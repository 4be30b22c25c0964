// CUDA kernels of the guard_refusal example: the seed scenario's gather + read on the device.
#include "guard_refusal_kernels.hpp"

namespace guard_refusal {
namespace {

__device__ std::int64_t d_cmp_value(int b, int c) { return 1'000'000LL * (b + 1) + 500'000 + c; }
__device__ std::int64_t d_swa_value(int b, int pos) { return 1'000'000LL * (b + 1) + pos; }

// One block per request. N and M are frozen at capture; the lengths come from device memory.
__global__ void gather_kernel(std::int64_t* ws, std::int64_t N, std::int64_t M, const int* lens, int ratio,
                              int window) {
  const int b = blockIdx.x;
  const int L = lens[b], n_c = L / ratio, g = L < window ? L : window;
  for (int c = threadIdx.x; c < n_c; c += blockDim.x) ws[b * M + c] = d_cmp_value(b, c);
  for (int i = threadIdx.x; i < g; i += blockDim.x) ws[b * M + N + i] = d_swa_value(b, L - g + i);
}

__global__ void read_kernel(const std::int64_t* ws, std::int64_t N, std::int64_t M, const int* lens, int ratio,
                            int window, std::int64_t* out, int* out_len, int out_stride) {
  const int b = blockIdx.x;
  const int L = lens[b], n_c = L / ratio, g = L < window ? L : window;
  const int n = n_c + g < out_stride ? n_c + g : out_stride;
  for (int j = threadIdx.x; j < n; j += blockDim.x)
    out[b * out_stride + j] = j < n_c ? ws[b * M + j] : ws[b * M + N + (j - n_c)];
  if (threadIdx.x == 0) out_len[b] = n;
}

}  // namespace

cudaError_t launch_decode_step(cudaStream_t s, std::int64_t* ws, std::int64_t N, std::int64_t M,
                               const int* d_lens, int requests, int ratio, int window,
                               std::int64_t* d_out, int* d_out_len, int out_stride) {
  gather_kernel<<<requests, 128, 0, s>>>(ws, N, M, d_lens, ratio, window);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  read_kernel<<<requests, 128, 0, s>>>(ws, N, M, d_lens, ratio, window, d_out, d_out_len, out_stride);
  return cudaGetLastError();
}

}  // namespace guard_refusal
