// VirtualMemory: reserve address space, map physical memory behind it in granules, from a pool of
// chunks reused across workspaces, graphs and arenas. The backing of the arena's virtual-growth
// mode (ArenaOptions::virtual_memory, docs/virtual_growth.md):
//
//   auto vm = std::make_shared<graphsafe::CudaVirtualMemory>();       // granularity: 2 MiB on H200
//   graphsafe::Arena arena(backend, {.virtual_memory = vm});
//   auto g = graphsafe::capture(arena, s, b, fn);   // bound reserved as VA, capture-time need mapped
//   g.replay(grown, s);                             // guards, map what grew (same addresses), launch
//   arena.shrink(s, bindings);                      // explicit: unmap what `bindings` do not need
//
// Two implementations of one contract: CudaVirtualMemory (cuMemAddressReserve / cuMemCreate /
// cuMemMap / cuMemSetAccess) and HostVirtualMemory (mmap PROT_NONE + a memfd whose pages are the
// "physical chunks", mapped MAP_FIXED), so the arena's logic is tested on the CPU. A chunk is one
// granule; unmapped chunks go back to the pool (their contents are not cleared) and are reused
// before the driver is asked for a new one. A mapped chunk can be mapped again at another address
// (alias()): the same physical bytes at two addresses, which ArenaOptions::virtual_sharing uses for
// workspaces whose lifetimes in a capture are disjoint. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace graphsafe {

// Told of every mapping a VirtualMemory makes or removes (VirtualMemory::set_listener): what a
// communication library registers, e.g. graphsafe::nccl::ChunkRegistrar, which registers each
// mapped chunk with NCCL. Called under the VirtualMemory's lock, in mapping order.
class ChunkListener {
 public:
  virtual ~ChunkListener() = default;
  // `count` chunks were mapped at va, va + granularity, ... (map() or alias()) and are accessible.
  // `in_capture`: an arena mapped them for a graph it is capturing on this thread (capture-time
  // commits), where calls that are not capture-safe must wait until the capture ends. Throwing
  // undoes the mapping: map() or alias() rethrows with nothing of it left mapped.
  virtual void mapped(std::uintptr_t va, std::uint64_t count, bool in_capture) = 0;
  // `count` chunks at va are about to be unmapped; nothing uses them any more.
  virtual void unmapping(std::uintptr_t va, std::uint64_t count) noexcept = 0;
};

struct VirtualMemoryStats {
  std::uint64_t granularity = 0;
  std::uint64_t reserved_bytes = 0;    // address space held (all reservations)
  std::uint64_t reservations = 0;
  std::uint64_t chunks_created = 0;    // physical chunks ever created (driver calls)
  std::uint64_t chunks_released = 0;   // ... and given back to the driver (trim_pool)
  std::uint64_t chunks_mapped = 0;     // mapped now
  std::uint64_t chunks_pooled = 0;     // held, unmapped, ready for reuse
  std::uint64_t pool_hits = 0;         // maps served from the pool (no creation)
  std::uint64_t map_calls = 0;         // chunk maps
  std::uint64_t unmap_calls = 0;       // chunk unmaps
  std::uint64_t alias_mapped = 0;      // extra mappings of mapped chunks now (alias())
  std::uint64_t alias_calls = 0;       // chunk aliases ever made
  std::uint64_t physical_bytes() const { return (chunks_mapped + chunks_pooled) * granularity; }
};

class VirtualMemory {
 public:
  virtual ~VirtualMemory() = default;
  VirtualMemory(const VirtualMemory&) = delete;
  VirtualMemory& operator=(const VirtualMemory&) = delete;
  virtual std::string_view name() const = 0;

  std::uint64_t granularity() const { return granule_; }

  // Reserve `bytes` (rounded up to the granularity) of address space; nothing is mapped.
  // Throws out_of_memory_error when the address space cannot be reserved.
  std::uintptr_t reserve(std::uint64_t bytes);
  // Give a reservation back; everything in it must be unmapped.
  void unreserve(std::uintptr_t va, std::uint64_t bytes) noexcept;
  // Map `count` chunks at va, va + granularity, ... (va granule-aligned, inside a reservation, not
  // mapped), readable and writable by the device; the chunk handles are written to `chunks`.
  // All or nothing: throws out_of_memory_error (no physical memory) or cuda_error, with nothing
  // left mapped.
  void map(std::uintptr_t va, std::uint64_t count, std::uint64_t* chunks);
  // Unmap `count` chunks at va (mapped by map()); the chunks return to the pool. The caller makes
  // sure nothing uses the range (no replay in flight).
  // A chunk returns to the pool when its last mapping (map() or alias()) is unmapped.
  void unmap(std::uintptr_t va, std::uint64_t count, const std::uint64_t* chunks);
  // Map `count` chunks that are mapped now (by map() or alias()) at va, va + granularity, ... as
  // well (va as for map()): writes through one address are seen through the other. All or nothing;
  // throws invalid_argument_error naming the chunk when one is not mapped (pooled, released, or
  // never made by this object).
  void alias(std::uintptr_t va, std::uint64_t count, const std::uint64_t* chunks);
  // How many addresses `chunk` is mapped at now (0: pooled or unknown).
  std::uint64_t mappings(std::uint64_t chunk) const;
  // Give pooled (unmapped) chunks back to the driver, keeping `keep_chunks` of them.
  void trim_pool(std::uint64_t keep_chunks = 0);

  VirtualMemoryStats stats() const;

  // One listener told of every later map(), alias() and unmap() (null: none). Set it before the
  // memory serves anything: chunks mapped earlier are not reported.
  void set_listener(std::shared_ptr<ChunkListener> listener);
  // While one lives on a thread, that thread's maps are reported with in_capture = true. The
  // arena opens one around the mappings it makes while capturing.
  class CaptureTimeMaps {
   public:
    CaptureTimeMaps() noexcept;
    ~CaptureTimeMaps();
    CaptureTimeMaps(const CaptureTimeMaps&) = delete;
    CaptureTimeMaps& operator=(const CaptureTimeMaps&) = delete;
  };
  static bool capture_time_maps() noexcept;

 protected:
  explicit VirtualMemory(std::uint64_t granularity) : granule_(granularity) {}
  // Primitive operations of one implementation (called under the pool's lock).
  virtual std::uintptr_t do_reserve(std::uint64_t bytes) = 0;           // throws out_of_memory_error
  virtual void do_unreserve(std::uintptr_t va, std::uint64_t bytes) noexcept = 0;
  virtual std::uint64_t do_create_chunk() = 0;                          // throws out_of_memory_error
  virtual void do_release_chunk(std::uint64_t chunk) noexcept = 0;
  virtual void do_map(std::uintptr_t va, std::uint64_t chunk) = 0;      // one granule
  virtual void do_set_access(std::uintptr_t va, std::uint64_t bytes) = 0;  // after mapping a run
  virtual bool do_unmap(std::uintptr_t va) noexcept = 0;                // one granule; false: failed
  // Implementations call this from their destructor: releases pooled chunks.
  void release_pool_noexcept() noexcept;

 private:
  const std::uint64_t granule_;
  mutable std::mutex m_;
  std::vector<std::uint64_t> pool_;
  std::unordered_map<std::uint64_t, std::uint64_t> maps_;  // mapped chunk -> addresses it is mapped at
  std::unordered_set<std::uint64_t> leaked_;                // a failed unmap may have left it mapped
  VirtualMemoryStats st_;
  std::shared_ptr<ChunkListener> listener_;
};

// ---- host twin -----------------------------------------------------------------------------------

struct HostVirtualMemoryOptions {
  std::uint64_t granularity = 64 << 10;  // a multiple of the page size
  std::uint64_t limit_bytes = 0;         // cap on physical chunks (mapped + pooled); 0 = none
};

// Address space from mmap(PROT_NONE); chunks are ranges of one memfd, mapped MAP_SHARED|MAP_FIXED,
// filled with 0xA5 when created (never zeros). Touching an unmapped address faults, as on a GPU.
class HostVirtualMemory final : public VirtualMemory {
 public:
  explicit HostVirtualMemory(HostVirtualMemoryOptions o = {});
  ~HostVirtualMemory() override;
  std::string_view name() const override { return "host"; }
  // True when [p, p + bytes) is mapped (checked through mincore-free bookkeeping, for tests).
  bool is_mapped(const void* p, std::uint64_t bytes) const;
  // The chunk mapped at p's granule, or -1 when none: where p's bytes physically are (chunk
  // * granularity + p % granularity in the memfd), so tests can tell aliases from distinct memory.
  std::int64_t chunk_at(const void* p) const;

 protected:
  std::uintptr_t do_reserve(std::uint64_t bytes) override;
  void do_unreserve(std::uintptr_t va, std::uint64_t bytes) noexcept override;
  std::uint64_t do_create_chunk() override;
  void do_release_chunk(std::uint64_t chunk) noexcept override;
  void do_map(std::uintptr_t va, std::uint64_t chunk) override;
  void do_set_access(std::uintptr_t, std::uint64_t) override {}
  bool do_unmap(std::uintptr_t va) noexcept override;

 private:
  HostVirtualMemoryOptions opts_;
  int fd_ = -1;
  std::uint64_t fd_chunks_ = 0;           // chunks the memfd holds (offsets 0 .. fd_chunks_-1)
  std::vector<std::uint64_t> free_slots_; // released chunk offsets, reused by do_create_chunk
  std::uint64_t live_chunks_ = 0;
  mutable std::mutex mapped_m_;
  std::map<std::uintptr_t, std::uint64_t> mapped_;  // granule address mapped now -> its chunk
};

// ---- CUDA ------------------------------------------------------------------------------------------

struct CudaVirtualMemoryOptions {
  int device = -1;             // -1: the current device
  std::uint64_t limit_bytes = 0;  // cap on physical chunks (mapped + pooled); 0 = none (device memory)
  // Chunks exportable as POSIX file descriptors: what NCCL needs to map a registered chunk on peer
  // GPUs (IPC and symmetric-window registration, docs/tensor_parallel.md).
  bool shareable = false;
};

// The CUDA virtual memory management API on one device: chunks from cuMemCreate (pinned device
// memory, CU_MEM_ALLOC_GRANULARITY_MINIMUM), read/write access for that device. Driver calls are
// made with the thread's capture mode exchanged to relaxed, so a capture-time commit does not
// invalidate a global-mode capture (none of them is stream-ordered: nothing enters the graph).
class CudaVirtualMemory final : public VirtualMemory {
 public:
  explicit CudaVirtualMemory(CudaVirtualMemoryOptions o = {});
  ~CudaVirtualMemory() override;
  std::string_view name() const override { return "cuda"; }
  int device() const { return device_; }
  // cuMemGetAllocationGranularity for this class's chunks (pinned device memory) on `device` (-1:
  // the current one): the minimum, which chunks use, and the recommended one. 2 MiB and 2 MiB on
  // an H200: nothing finer can be mapped.
  static std::uint64_t minimum_granularity(int device = -1);
  static std::uint64_t recommended_granularity(int device = -1);

 protected:
  std::uintptr_t do_reserve(std::uint64_t bytes) override;
  void do_unreserve(std::uintptr_t va, std::uint64_t bytes) noexcept override;
  std::uint64_t do_create_chunk() override;
  void do_release_chunk(std::uint64_t chunk) noexcept override;
  void do_map(std::uintptr_t va, std::uint64_t chunk) override;
  void do_set_access(std::uintptr_t va, std::uint64_t bytes) override;
  bool do_unmap(std::uintptr_t va) noexcept override;

 private:
  static std::uint64_t query_granularity(int device, bool recommended = false);
  CudaVirtualMemoryOptions opts_;
  int device_ = 0;
  void* ctx_ = nullptr;  // the device's primary context (retained)
  std::uint64_t live_chunks_ = 0;
};

// What a captured graph's virtual workspaces hold (CapturedGraph::virtual_stats).
struct VirtualGraphStats {
  bool virtual_mode = false;             // false: the graph's region is ordinary (slab) memory
  std::uint64_t reserved_bytes = 0;      // the plan's bytes: what a bound-sized region would hold
  std::uint64_t va_bytes = 0;            // the family's address-space reservation
  std::uint64_t committed_bytes = 0;     // physical bytes mapped in the family's range now
  // Bytes of the family's range mapped now: committed_bytes, except under virtual sharing, where
  // a chunk mapped at several addresses counts at each.
  std::uint64_t mapped_bytes = 0;
  std::uint64_t granularity = 0;
  std::uint64_t workspaces = 0;          // captured requests with a footprint
  std::uint64_t fast_commits = 0;        // replays whose need was already mapped (a few compares)
  std::uint64_t slow_commits = 0;        // replays that looked at the mapping
  std::uint64_t grow_events = 0;         // ... of which mapped new chunks
  // Only with bindings: bytes the footprints touch under them (exact need), and the touched
  // granules (the least any mapping at this granularity can commit, for this graph alone).
  std::uint64_t exact_need_bytes = 0;
  std::uint64_t granule_need_bytes = 0;
  // Only with bindings: separately addressed ranges the need is made of (one per workspace whose
  // need is a prefix, one per non-empty per-request range). Each costs at most one partly used
  // granule beyond its bytes (docs/virtual_growth.md, "The target").
  std::uint64_t touched_ranges = 0;
};

}  // namespace graphsafe
