// Upload of a host DecodeProblem into one device allocation.
#include <graphsafe/ds4/device_problem.hpp>

#include "cuda_support.cuh"

#include <stdexcept>
#include <string>
#include <vector>

namespace graphsafe::ds4::cuda {

void DeviceFree::operator()(void* p) const noexcept { cudaFree(p); }

DeviceBytes device_alloc(std::size_t bytes) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes == 0 ? 16 : bytes);
  if (err != cudaSuccess)
    throw graphsafe::cuda_error("graphsafe::ds4: cudaMalloc of " + std::to_string(bytes) +
                                    " bytes failed: " + cudaGetErrorString(err),
                                static_cast<int>(err));
  return DeviceBytes(static_cast<std::uint8_t*>(p));
}

namespace {
std::size_t align256(std::size_t x) { return (x + 255) / 256 * 256; }
}  // namespace

DeviceProblem upload(const DecodeProblem& p) {
  DeviceProblem d;
  d.cfg = p.cfg;
  d.batch = p.batch;
  d.swa_blocks_per_req = p.swa_blocks_per_req;
  d.cmp_blocks_per_req = p.cmp_blocks_per_req;
  struct Part { const void* src; std::size_t bytes; std::size_t off; };
  std::vector<Part> parts;
  std::size_t total = 0;
  auto add = [&](const void* src, std::size_t bytes) {
    parts.push_back({src, bytes, total});
    total = align256(total + bytes);
    return parts.size() - 1;
  };
  const auto i_swa = add(p.swa_cache.data(), p.swa_cache.size());
  const auto i_cmp = add(p.cmp_cache.data(), p.cmp_cache.size());
  const auto i_len = add(p.seq_lens.data(), p.seq_lens.size() * 4);
  const auto i_sbt = add(p.swa_block_table.data(), p.swa_block_table.size() * 4);
  const auto i_cbt = add(p.cmp_block_table.data(), p.cmp_block_table.size() * 4);
  const auto i_top = add(p.topk_local.data(), p.topk_local.size() * 4);
  const auto i_q = add(p.q.data(), p.q.size() * 2);
  const auto i_sink = add(p.sink.data(), p.sink.size() * 4);
  d.storage = device_alloc(total);
  std::uint8_t* base = d.storage.get();
  for (const Part& pt : parts)
    if (pt.bytes > 0)
      detail::check_cuda(cudaMemcpy(base + pt.off, pt.src, pt.bytes, cudaMemcpyHostToDevice),
                         "cudaMemcpy(upload DecodeProblem)");
  d.swa = {base + parts[i_swa].off, p.cfg.swa_block_tokens, p.swa_num_blocks,
           block_stride_bytes(p.cfg.swa_block_tokens)};
  if (p.cfg.ratio > 1)
    d.cmp = {base + parts[i_cmp].off, p.cfg.compressed_block_entries(), p.cmp_num_blocks,
             block_stride_bytes(p.cfg.compressed_block_entries())};
  d.seq_lens = reinterpret_cast<std::int32_t*>(base + parts[i_len].off);
  d.swa_block_table = reinterpret_cast<std::int32_t*>(base + parts[i_sbt].off);
  d.cmp_block_table = p.cmp_block_table.empty() ? nullptr : reinterpret_cast<std::int32_t*>(base + parts[i_cbt].off);
  d.topk_local = p.topk_local.empty() ? nullptr : reinterpret_cast<std::int32_t*>(base + parts[i_top].off);
  d.q = reinterpret_cast<std::uint16_t*>(base + parts[i_q].off);
  d.sink = reinterpret_cast<float*>(base + parts[i_sink].off);
  return d;
}

void upload_lengths(DeviceProblem& d, const DecodeProblem& p, cudaStream_t stream) {
  if (p.batch != d.batch)
    throw graphsafe::invalid_argument_error("graphsafe::ds4::cuda::upload_lengths: batch = " +
                                            std::to_string(p.batch) + " differs from the uploaded problem's " +
                                            std::to_string(d.batch));
  detail::check_cuda(cudaMemcpyAsync(d.seq_lens, p.seq_lens.data(), p.seq_lens.size() * 4,
                                     cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync(seq_lens)");
  if (d.topk_local != nullptr && !p.topk_local.empty())
    detail::check_cuda(cudaMemcpyAsync(d.topk_local, p.topk_local.data(), p.topk_local.size() * 4,
                                       cudaMemcpyHostToDevice, stream), "cudaMemcpyAsync(topk_local)");
  detail::check_cuda(cudaMemcpyAsync(d.q, p.q.data(), p.q.size() * 2, cudaMemcpyHostToDevice, stream),
                     "cudaMemcpyAsync(q)");
  detail::check_cuda(cudaMemcpyAsync(d.sink, p.sink.data(), p.sink.size() * 4, cudaMemcpyHostToDevice, stream),
                     "cudaMemcpyAsync(sink)");
}

}  // namespace graphsafe::ds4::cuda
