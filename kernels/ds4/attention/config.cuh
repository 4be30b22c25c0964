// DS4 sparse attention: tile shapes, the shared-memory plans of the two kernels, the named
// barriers of the warp-specialized kernel and the register split between its roles.
//
//   std::uint8_t* k = smem + offsetof(WsSmem, tiles.k);   // stage s at k + s * kWgKBytes
//   bar_sync(kBarFull0 + stage, kWsThreads);
#pragma once

#include "../cuda_support.cuh"

#include <cstddef>
#include <cstdint>

namespace graphsafe::ds4::cuda::attention {

using namespace detail;

constexpr int kTileRows = 64;     // attended rows per tile
constexpr int kGroupHeads = 64;   // heads per CTA
constexpr float kLog2e = 1.4426950408889634f;

// ---- mma.sync kernel (portable): row-major tiles padded for conflict-free ldmatrix
constexpr int kThreads = 512;
constexpr int kRowGroups = 4;                 // S warps per head group (16 rows each)
constexpr int kQStride = kHeadDim + 8;        // bf16 elements per smem row (1040 B)
constexpr int kPStride = kTileRows + 8;       // 144 B
constexpr int kRawStride = 592;               // 576 data + 8 scales + 8 pad (16-B multiple)
constexpr int kQBytes = kGroupHeads * kQStride * 2;        // 66560
constexpr int kKBytes = kTileRows * kQStride * 2;          // 66560
constexpr int kPBytes = kGroupHeads * kPStride * 2;        // 9216
constexpr int kRawBytes = kTileRows * kRawStride;          // 37888
constexpr int kMiscBytes = (2 * kRowGroups + 2) * 64 * 4;  // red[4][64], lsum[4][64], vld[2][64]

// The mma.sync kernel's shared memory: Q, one bf16 K tile (paged: dequantized from two raw fp8
// stages) or two (workspace: cp.async double buffer), P, and the reductions.
struct MmaMisc {
  float red[kRowGroups][64];   // per row group: row maxima of the tile
  float lsum[kRowGroups][64];  // per row group: row sums
  int vld[2][64];              // per stage: the row is a cache row
};
template <bool kPaged>
struct MmaSmem;
template <>
struct MmaSmem<true> {
  std::uint16_t q[kGroupHeads * kQStride];
  std::uint16_t k[1][kTileRows * kQStride];
  std::uint16_t p[kGroupHeads * kPStride];
  std::uint8_t raw[2][kRawBytes];  // fp8 rows + scales as loaded, per stage
  MmaMisc misc;
};
template <>
struct MmaSmem<false> {
  std::uint16_t q[kGroupHeads * kQStride];
  std::uint16_t k[2][kTileRows * kQStride];
  std::uint16_t p[kGroupHeads * kPStride];
  MmaMisc misc;
};
static_assert(offsetof(MmaSmem<true>, k) == kQBytes && offsetof(MmaSmem<true>, p) == kQBytes + kKBytes &&
                  offsetof(MmaSmem<true>, raw) == kQBytes + kKBytes + kPBytes &&
                  offsetof(MmaSmem<true>, misc) == kQBytes + kKBytes + kPBytes + 2 * kRawBytes,
              "mma.sync paged plan: Q, K, P, raw stages, reductions");
static_assert(offsetof(MmaSmem<false>, p) == kQBytes + 2 * kKBytes &&
                  offsetof(MmaSmem<false>, misc) == kQBytes + 2 * kKBytes + kPBytes,
              "mma.sync workspace plan: Q, two K stages, P, reductions");
static_assert(sizeof(MmaMisc) == kMiscBytes, "mma.sync reductions");
static_assert(sizeof(MmaSmem<true>) <= 227 * 1024 && sizeof(MmaSmem<false>) <= 227 * 1024,
              "mma.sync attention smem over the sm_90 limit");
static_assert(kQStride * 2 % 16 == 0 && kPStride * 2 % 16 == 0 && kRawStride % 16 == 0, "ldmatrix / cp.async rows: 16-byte multiples");

// ---- warp-specialized kernel (sm_90a). Q, K and P live in the no-swizzle canonical layout,
// 8-row x 16-byte core matrices, element (r, k) at (r/8)*SBO + (k/8)*128 + (r%8)*16 + (k%8)*2. The K
// tile is read K-major for S = Q K^T and MN-major for O += P V.
constexpr int kWgQBytes = kGroupHeads * kHeadDim * 2;  // 65536
constexpr int kWgKBytes = kTileRows * kHeadDim * 2;    // 65536
constexpr int kWgRowSbo = (kHeadDim / 8) * 128;        // 8192: next 8 rows of Q / K
constexpr int kWsPBytes = kGroupHeads * kTileRows * 2;  // 8192: P (bf16), canonical K-major layout
constexpr int kWsPSbo = (kTileRows / 8) * 128;          // 1024: next 8 heads of P
constexpr int kWsOutStride = kHeadDim * 2 + 16;         // bytes per head row of the staged output (bank spread)

__device__ __forceinline__ int blk16(int r, int kc) {  // byte offset of 16-byte chunk kc of row r
  return (r >> 3) * kWgRowSbo + kc * 128 + (r & 7) * 16;
}

constexpr int kWsConsumers = 256;                   // math + PV warpgroups
constexpr int kWsThreads = kWsConsumers + 128;      // + the producer warpgroup
// Registers per thread after setmaxnreg: the CTA holds 384 x 168; the producer gives back what the
// consumers take: 128 x (168 - P) = 256 x (C - 168). The math warpgroup holds O (128 fp32) + S (32)
// + P (16) + addressing, the PV warpgroup O; they share the count because they share the
// epilogue's code. C = 192 leaves the producer 120: two rows x 9 loads in flight (76 registers) plus
// addressing.
constexpr int kWsConsumerRegs = 192;
constexpr int kWsProducerRegs = 168 - 2 * (kWsConsumerRegs - 168);
static_assert(kWsProducerRegs >= 24 && kWsProducerRegs % 8 == 0 && kWsConsumerRegs % 8 == 0, "setmaxnreg counts");

// The cluster merge's view of the Q / K area (free once every rank has passed the merge's first
// cluster barrier): the peers' partial O, their (m, l) and the bf16 output stage.
struct MergeArea {
  float4 recv[128 * 1024 / 16];  // [ranks][32][threads per owner] float4 (two ranks: one slot)
  float ml[4][128];              // [rank][head][m, l]
  std::uint8_t reserved[2048];
  std::uint8_t stage[32 * kWsOutStride];  // [heads of this rank][kWsOutStride]
};
// The ws kernel's shared memory.
struct WsSmem {
  union {
    struct {
      std::uint8_t q[kWgQBytes];        // queries, bf16, canonical K-major
      std::uint8_t k[2][kWgKBytes];     // K tile stages, bf16, canonical (read K-major and MN-major)
    } tiles;
    MergeArea merge;
  };
  std::uint8_t p[kWsPBytes];  // P of the tile (bf16, canonical), math -> PV warpgroup
  float2 alpha[128];          // rescale factors of the PV warpgroup's rows, math -> PV
  float4 ml[128];             // (m, l) after the tile loop, math -> PV
  int vld[2][64];             // per stage: the row is a cache row
};
static_assert(offsetof(WsSmem, tiles.k) == kWgQBytes && offsetof(WsSmem, p) == kWgQBytes + 2 * kWgKBytes,
              "ws plan: Q, then the two K stages, then P");
static_assert(offsetof(WsSmem, merge.ml) == 128 * 1024 && offsetof(WsSmem, merge.stage) == 132 * 1024 &&
                  sizeof(MergeArea) <= kWgQBytes + 2 * kWgKBytes,
              "ws plan: the merge areas lie inside the Q / K area");
static_assert(offsetof(WsSmem, tiles.k) % 128 == 0 && offsetof(WsSmem, p) % 128 == 0 && kWgKBytes % 128 == 0,
              "ws plan: wgmma operands on 128-byte boundaries");
static_assert(offsetof(WsSmem, alpha) % 16 == 0 && offsetof(WsSmem, ml) % 16 == 0 && offsetof(WsSmem, vld) % 16 == 0,
              "ws plan: vector handoff areas 16-byte aligned");
constexpr int kWsSmemBytes = sizeof(WsSmem);
static_assert(kWsSmemBytes == 208384 && kWsSmemBytes <= 227 * 1024, "warp-specialized attention smem");

// The kernel addresses the plan from the dynamic shared-memory base: Q at 0, the K stages after
// it, then P, alpha, (m, l) and the valid-row flags, each area right after the previous one.
static_assert(offsetof(WsSmem, tiles.q) == 0 && offsetof(WsSmem, tiles.k) == kWgQBytes &&
                  offsetof(WsSmem, p) == kWgQBytes + 2 * kWgKBytes &&
                  offsetof(WsSmem, alpha) == offsetof(WsSmem, p) + kWsPBytes &&
                  offsetof(WsSmem, ml) == offsetof(WsSmem, alpha) + 128 * sizeof(float2) &&
                  offsetof(WsSmem, vld) == offsetof(WsSmem, ml) + 128 * sizeof(float4) &&
                  offsetof(WsSmem, merge.recv) == 0 && offsetof(WsSmem, merge.ml) == 128 * 1024 &&
                  offsetof(WsSmem, merge.stage) == 132 * 1024,
              "ws plan: the areas follow each other as the kernel addresses them");

// Named barriers of the ws kernel (0 is __syncthreads). Each handoff buffer is released by the next
// handoff the other way.
enum NamedBarrier : int {
  kBarFull0 = 1,   // FULL[stage] (1, 2): producer -> consumers, the stage's rows are stored
  kBarEmpty0 = 3,  // EMPTY[stage] (3, 4): consumers -> producer, the stage may be refilled
  kBarQ = 5,       // consumers: queries stored; after the loop, (m, l) handed to the PV warpgroup
  kBarPReady = 6,  // math -> PV: P and the rescale factors of tile j written
  kBarPFree = 7,   // PV -> math: the PV warpgroup's PV of tile j - 1 done (P, alpha may be overwritten)
  kBarOut = 8,     // consumers of a generic cluster merge: the output stage is complete
  kBarOwners = 9,  // the 128 threads that merge a rank's heads (two-rank merge): a batch is staged
};

// Named barriers in their unaligned forms (barrier.sync / barrier.arrive, no .aligned): one
// generation of FULL, EMPTY, Q or P_FREE is reached from different static sites (the producer, the
// math and the PV warpgroups each have their own code), and the aligned forms (bar.sync, bar.arrive)
// promise that every thread of a generation executes the same instruction. compute-sanitizer
// synccheck reports the aligned forms here as divergent barriers.
__device__ __forceinline__ void bar_sync(int id, int n) { asm volatile("barrier.sync %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }
__device__ __forceinline__ void bar_arrive(int id, int n) { asm volatile("barrier.arrive %0, %1;\n" ::"r"(id), "r"(n) : "memory"); }

template <int N>
__device__ __forceinline__ void setmaxnreg_inc() {
#ifndef GRAPHSAFE_DS4_NO_WGMMA
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() {
#ifndef GRAPHSAFE_DS4_NO_WGMMA
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N));
#endif
}

}  // namespace graphsafe::ds4::cuda::attention
