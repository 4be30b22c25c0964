// Tensor-parallel support shared by the NCCL GPU test and nccl_bench: registered arena memory whose
// registration calls are counted (CheckedRegisteredMemory), and one rank's share of a
// tensor-parallel DS4 attention layer (TpAttention):
// rank r of `world` attends heads [r * H/world, (r+1) * H/world) of the full layer's H heads (its
// query rows sliced out of the full q, its sinks), writes them to an arena workspace, all-gathers
// every rank's heads inside the same stream (a captured graph when capturing) and puts them back
// in head order, so `out` holds [B, H, 512] as the single-GPU layer writes it. The DS4 kernels
// take 64 or 128 heads per call, so the full layer has 64 * world (or 128 * world) heads.
#pragma once

#include <graphsafe/arena.hpp>
#include <graphsafe/cuda_backend.hpp>
#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/layout.hpp>
#include <graphsafe/ds4/paged_attention.hpp>
#include <graphsafe/error.hpp>
#include <graphsafe/nccl/nccl.hpp>
#include <graphsafe/nccl/registrar.hpp>
#include <graphsafe/virtual_memory.hpp>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <string>
#include <utility>

namespace graphsafe::tp {

// Registration calls that count themselves and ask the capture stream, at every call, whether it
// is capturing: `while_capturing` must stay 0 (registration is never captured).
class CaptureCheckedCalls final : public nccl::RegistrationCalls {
 public:
  CaptureCheckedCalls(std::unique_ptr<nccl::RegistrationCalls> inner, cudaStream_t s)
      : inner_(std::move(inner)), s_(s) {}
  std::string kind() const override { return inner_->kind(); }
  void* register_range(void* p, std::uint64_t bytes) override {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    GRAPHSAFE_CUDA(cudaStreamIsCapturing(s_, &st));
    if (st != cudaStreamCaptureStatusNone) ++*while_capturing;
    ++*calls;
    return inner_->register_range(p, bytes);
  }
  bool deregister(void* h) noexcept override { return inner_->deregister(h); }
  std::shared_ptr<std::uint64_t> calls = std::make_shared<std::uint64_t>(0);
  std::shared_ptr<std::uint64_t> while_capturing = std::make_shared<std::uint64_t>(0);

 private:
  std::unique_ptr<nccl::RegistrationCalls> inner_;
  cudaStream_t s_;
};

// Virtual memory whose chunks are registered with `comm` as they are mapped (a ChunkRegistrar as its
// listener), through CaptureCheckedCalls on `s`: the arena memory of the NCCL test and nccl_bench,
// which compare the registrations against the chunk maps and check none happens while capturing.
// Shareable chunks: NCCL maps registered chunks on its peers. The registrar stays vm's listener
// until the caller detaches it (vm->set_listener(nullptr)) or vm goes; comm must outlive both.
struct CheckedRegisteredMemory {
  CheckedRegisteredMemory(ncclComm_t comm, nccl::Registration kind, cudaStream_t s)
      : vm(std::make_shared<CudaVirtualMemory>(CudaVirtualMemoryOptions{.shareable = true})) {
    auto checked = std::make_unique<CaptureCheckedCalls>(nccl::nccl_registration(comm, kind), s);
    calls = checked->calls;
    while_capturing = checked->while_capturing;
    kind_name = checked->kind();
    registrar = std::make_shared<nccl::ChunkRegistrar>(std::move(checked), vm->granularity());
    vm->set_listener(registrar);
  }

  // An arena on this memory reserving `reserve_bytes` of address space.
  ArenaOptions arena_options(std::uint64_t reserve_bytes) const {
    ArenaOptions ao;
    ao.virtual_memory = vm;
    ao.virtual_reserve_bytes = reserve_bytes;
    return ao;
  }

  std::shared_ptr<CudaVirtualMemory> vm;
  std::shared_ptr<nccl::ChunkRegistrar> registrar;
  std::shared_ptr<std::uint64_t> calls;            // registrations made
  std::shared_ptr<std::uint64_t> while_capturing;  // of them, made while `s` was capturing (must stay 0)
  std::string kind_name;                           // the registration calls' kind()
};

inline ds4::LayerConfig rank_layer(ds4::LayerConfig full, int world) {
  if (world < 1 || full.heads % world != 0)
    throw invalid_argument_error("tp: " + std::to_string(full.heads) + " heads do not split over " +
                                 std::to_string(world) + " ranks");
  full.heads /= world;
  return full;
}

class TpAttention {
 public:
  TpAttention(const ds4::LayerConfig& full, int rank, int world)
      : full_(full), rank_(rank), world_(world), op_({rank_layer(full, world), 1}) {}

  const ds4::PagedAttention& op() const { return op_; }
  int heads_per_rank() const { return full_.heads / world_; }

  // `a`: the full layer's arguments (q [B, H, 512], sink [H]); `out`: [B, H, 512] bf16.
  void run(Arena& arena, cudaStream_t s, const ds4::Ds4Symbols& syms, const Bindings& b,
           const ds4::AttentionArguments& a, std::uint16_t* out, ncclComm_t comm) const {
    const int hr = heads_per_rank();
    const std::uint64_t head_bytes = ds4::kHeadDim * 2;
    const std::uint64_t row_full = full_.heads * head_bytes, row_rank = hr * head_bytes;
    const Extent per_rank = Extent(syms.requests) * (std::int64_t(hr) * ds4::kHeadDim);
    Workspace q = arena.request(s, "tp.q", per_rank, 2, capacity_bound, b);
    Workspace part = arena.request(s, "tp.heads", per_rank, 2, capacity_bound, b);
    Workspace all = arena.request(s, "tp.gathered", per_rank * world_, 2, capacity_bound, b);
    const std::uint64_t B = static_cast<std::uint64_t>(a.batch);
    GRAPHSAFE_CUDA(cudaMemcpy2DAsync(q.data(), row_rank, reinterpret_cast<const std::uint8_t*>(a.q) + rank_ * row_rank,
                                     row_full, row_rank, B, cudaMemcpyDeviceToDevice, s));
    ds4::AttentionArguments mine = a;
    mine.q = q.as<std::uint16_t>();
    mine.sink = a.sink ? a.sink + rank_ * hr : nullptr;
    mine.out = part.as<std::uint16_t>();
    const ds4::AttentionWorkspaces w = op_.request(arena, s, syms, b);
    op_.run(mine, w, s);
    nccl::all_gather(part, all, ncclBfloat16, comm, s);
    // Rank-major [world, B, H/world, 512] back to [B, H, 512].
    for (int r = 0; r < world_; ++r)
      GRAPHSAFE_CUDA(cudaMemcpy2DAsync(reinterpret_cast<std::uint8_t*>(out) + r * row_rank, row_full,
                                       all.as<std::uint8_t>() + r * part.bytes(), row_rank, row_rank, B,
                                       cudaMemcpyDeviceToDevice, s));
  }

 private:
  ds4::LayerConfig full_;
  int rank_, world_;
  ds4::PagedAttention op_;
};

}  // namespace graphsafe::tp
