// Diagnostics only: the record layout of the ws attention kernel's timeline probe (the kernel
// instantiated with kernels/ds4/attention/timeline.cuh's TimelineProbe writes it; only
// bench/ds4_attention_bench.cu's -DGRAPHSAFE_DS4_TIMELINE build does, and reads it). One record
// per CTA launch, kSlots 64-bit values: clock64 stamps at phase edges (globaltimer for entry and
// exit). Per-tile slots hold 8 tiles (j & 7) unless noted. Internal: not installed, not in include/.
#pragma once

namespace graphsafe::ds4::cuda::timeline {

enum Slot : int {
  gtime_entry = 0,       // %globaltimer at entry (ns)
  gtime_exit = 1,        // %globaltimer after the output stores are issued (cluster merge path)
  clock_entry = 2,       // clock64 at entry
  cta_id = 3,            // smid << 32 | blockIdx.x | blockIdx.y << 8 | blockIdx.z << 24
  tiles = 4,             // tiles of this CTA (n)
  q_ready = 5,           // consumers: queries in shared memory
  full = 6,              // consumers: FULL of tile j acquired
  s_done = 14,           // consumers: S of tile j waited for
  pv_done = 22,          // consumers: PV of tile j waited for
  p_full_arrive = 30,    // producer: FULL of tile j arrived
  p_loads_start = 38,    // producer: before the loads of tile j
  loop_end = 46,         // consumers: after the tile loop (row sums exchanged)
  cluster_a = 47,        // consumers: merge barrier A passed
  cluster_b = 48,        // consumers: merge barrier B passed
  clock_exit = 49,       // consumers: output stores issued
  q_landed = 51,         // consumers: query registers used (see TLDEP: issue order, no wait)
  merge_weights = 52,    // merge: per-rank weights computed
  merged = 53,           // merge: bf16 stage written
  staged = 54,           // merge: stage barrier passed
  p_loads_issued = 56,   // producer: after the loads of tile j are issued (TLDEP does not wait for
                         // them to land)
  p_empty_ok = 64,       // producer: stage of tile j free (EMPTY passed)
  p_stores_done = 72,    // producer: dequantized tile j stored
  p_prefetched = 80,     // producer: L2 prefetch of tile j + 2 issued (after FULL of tile j)
  c_x_bar = 88,          // math warpgroup: P_FREE of tile j passed (j < 4)
  c_pv_start = 92,       // consumers: softmax of tile j done, before PV (j < 4)
  // The PV warpgroup's own stamps (its thread 0) and the producer's publication of the PV
  // warpgroup's half of a stage: written only by experimental builds that run PV ahead; zero in
  // the shipped kernel.
  pv_full = 96,          // PV warpgroup: FULL of tile j acquired
  pv_s_done = 104,       // PV warpgroup: its S part of tile j waited for
  pv_p_ok = 112,         // PV warpgroup: P_READY of tile j passed
  pv_pv_done = 120,      // PV warpgroup: its PV of tile j waited for
  p_hi_arrive = 128,     // producer: the PV warpgroup's half of tile j published (half stages)
  kSlots = 136,
};
constexpr int kMaxRecords = 8192;

}  // namespace graphsafe::ds4::cuda::timeline
