// Host launcher of the guard_refusal example's CUDA kernels (guard_refusal_kernels.cu).
//
// One decode step of the DS4-style gather, as the seed scenario does it: a gather kernel writes each
// request's compressed rows at ws[b*M + c] and its SWA rows at ws[b*M + N + i] (N and M are frozen
// kernel arguments, the lengths are read from a device buffer updated before every replay), then a
// "attention" kernel reads the rows back into out[b*out_stride + j] and writes out_len[b].
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace guard_refusal {

// Values written by the gather (identical on the host path): they name request, part and position,
// so any overlap between parts or requests shows in the output.
inline std::int64_t cmp_value(int b, int c) { return 1'000'000LL * (b + 1) + 500'000 + c; }
inline std::int64_t swa_value(int b, int pos) { return 1'000'000LL * (b + 1) + pos; }

// Enqueues both kernels on `s` (recorded when `s` is capturing). Returns the launch error, if any.
cudaError_t launch_decode_step(cudaStream_t s, std::int64_t* ws, std::int64_t N, std::int64_t M,
                               const int* d_lens, int requests, int ratio, int window,
                               std::int64_t* d_out, int* d_out_len, int out_stride);

}  // namespace guard_refusal
