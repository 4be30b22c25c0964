// VirtualMemory's chunk pool (shared by both implementations) and the host twin.
#include <graphsafe/error.hpp>
#include <graphsafe/virtual_memory.hpp>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

namespace graphsafe {

std::uintptr_t VirtualMemory::reserve(std::uint64_t bytes) {
  if (bytes == 0) throw invalid_argument_error("graphsafe: VirtualMemory::reserve(0)");
  const std::uint64_t rounded = (bytes + granule_ - 1) / granule_ * granule_;
  std::lock_guard g(m_);
  const std::uintptr_t va = do_reserve(rounded);
  st_.reserved_bytes += rounded;
  ++st_.reservations;
  return va;
}

void VirtualMemory::unreserve(std::uintptr_t va, std::uint64_t bytes) noexcept {
  const std::uint64_t rounded = (bytes + granule_ - 1) / granule_ * granule_;
  std::lock_guard g(m_);
  do_unreserve(va, rounded);
  st_.reserved_bytes -= rounded;
  --st_.reservations;
}

void VirtualMemory::map(std::uintptr_t va, std::uint64_t count, std::uint64_t* chunks) {
  if (count == 0) return;
  if (va % granule_ != 0)
    throw invalid_argument_error("graphsafe: VirtualMemory::map at an address that is not granule-aligned");
  std::lock_guard g(m_);
  std::uint64_t done = 0;
  try {
    for (; done < count; ++done) {
      std::uint64_t c;
      bool pooled = false;
      if (!pool_.empty()) {
        c = pool_.back();
        pool_.pop_back();
        pooled = true;
      } else {
        c = do_create_chunk();
        ++st_.chunks_created;
      }
      try {
        do_map(va + done * granule_, c);
      } catch (...) {
        pool_.push_back(c);
        if (!pooled) ++st_.chunks_pooled;  // a pooled chunk was still counted as pooled
        throw;
      }
      if (pooled) {
        --st_.chunks_pooled;
        ++st_.pool_hits;
      }
      chunks[done] = c;
      maps_[c] = 1;
      ++st_.chunks_mapped;
      ++st_.map_calls;
    }
    do_set_access(va, count * granule_);
    if (listener_) listener_->mapped(va, count, capture_time_maps());
  } catch (...) {
    for (std::uint64_t i = 0; i < done; ++i) {
      ++st_.unmap_calls;
      --st_.chunks_mapped;
      maps_.erase(chunks[i]);
      if (!do_unmap(va + i * granule_)) continue;  // never reuse a chunk that may still be mapped
      pool_.push_back(chunks[i]);
      ++st_.chunks_pooled;
    }
    throw;
  }
}

void VirtualMemory::alias(std::uintptr_t va, std::uint64_t count, const std::uint64_t* chunks) {
  if (count == 0) return;
  if (va % granule_ != 0)
    throw invalid_argument_error("graphsafe: VirtualMemory::alias at an address that is not granule-aligned");
  std::lock_guard g(m_);
  for (std::uint64_t i = 0; i < count; ++i)
    if (!maps_.contains(chunks[i]))
      throw invalid_argument_error("graphsafe: VirtualMemory::alias of chunk " + std::to_string(chunks[i]) +
                                   ", which is not mapped now; alias only chunks that map() returned and that are "
                                   "still mapped somewhere");
  std::uint64_t done = 0;
  try {
    for (; done < count; ++done) {
      do_map(va + done * granule_, chunks[done]);
      ++maps_[chunks[done]];
      ++st_.alias_mapped;
      ++st_.alias_calls;
      ++st_.map_calls;
    }
    do_set_access(va, count * granule_);
    if (listener_) listener_->mapped(va, count, capture_time_maps());
  } catch (...) {
    for (std::uint64_t i = 0; i < done; ++i) {
      ++st_.unmap_calls;
      --st_.alias_mapped;
      --maps_[chunks[i]];
      if (!do_unmap(va + i * granule_)) leaked_.insert(chunks[i]);
    }
    throw;
  }
}

std::uint64_t VirtualMemory::mappings(std::uint64_t chunk) const {
  std::lock_guard g(m_);
  const auto it = maps_.find(chunk);
  return it == maps_.end() ? 0 : it->second;
}

void VirtualMemory::unmap(std::uintptr_t va, std::uint64_t count, const std::uint64_t* chunks) {
  std::lock_guard g(m_);
  if (listener_ && count) listener_->unmapping(va, count);
  std::uint64_t failed = 0;
  for (std::uint64_t i = 0; i < count; ++i) {
    ++st_.unmap_calls;
    const bool ok = do_unmap(va + i * granule_);
    if (!ok) {
      ++failed;  // possibly still mapped: never reuse it (leaked rather than aliased)
      leaked_.insert(chunks[i]);
    }
    const auto m = maps_.find(chunks[i]);
    if (m != maps_.end() && m->second > 1) {  // still mapped at another address
      --m->second;
      --st_.alias_mapped;
      continue;
    }
    if (m != maps_.end()) maps_.erase(m);
    --st_.chunks_mapped;
    if (leaked_.erase(chunks[i])) continue;
    pool_.push_back(chunks[i]);
    ++st_.chunks_pooled;
  }
  if (failed)
    throw error("graphsafe: " + std::to_string(failed) + " of " + std::to_string(count) +
                " chunk unmaps failed; those chunks are not reused (leaked) -- is a replay still in flight?");
}

void VirtualMemory::trim_pool(std::uint64_t keep_chunks) {
  std::lock_guard g(m_);
  while (pool_.size() > keep_chunks) {
    do_release_chunk(pool_.back());
    pool_.pop_back();
    --st_.chunks_pooled;
    ++st_.chunks_released;
  }
}

void VirtualMemory::release_pool_noexcept() noexcept {
  std::lock_guard g(m_);
  for (std::uint64_t c : pool_) do_release_chunk(c);
  st_.chunks_released += pool_.size();
  st_.chunks_pooled = 0;
  pool_.clear();
}

void VirtualMemory::set_listener(std::shared_ptr<ChunkListener> listener) {
  std::lock_guard g(m_);
  listener_ = std::move(listener);
}

namespace {
thread_local int t_capture_time_maps = 0;
}
VirtualMemory::CaptureTimeMaps::CaptureTimeMaps() noexcept { ++t_capture_time_maps; }
VirtualMemory::CaptureTimeMaps::~CaptureTimeMaps() { --t_capture_time_maps; }
bool VirtualMemory::capture_time_maps() noexcept { return t_capture_time_maps > 0; }

VirtualMemoryStats VirtualMemory::stats() const {
  std::lock_guard g(m_);
  VirtualMemoryStats s = st_;
  s.granularity = granule_;
  return s;
}

// ---- host twin -----------------------------------------------------------------------------------

namespace {
std::uint64_t checked_host_granule(std::uint64_t g) {
  const auto page = static_cast<std::uint64_t>(::sysconf(_SC_PAGESIZE));
  if (g == 0 || g % page != 0)
    throw invalid_argument_error("graphsafe: HostVirtualMemory granularity " + std::to_string(g) +
                                 " is not a positive multiple of the page size (" + std::to_string(page) + ")");
  return g;
}
std::string errno_text() { return std::string(std::strerror(errno)); }
}  // namespace

HostVirtualMemory::HostVirtualMemory(HostVirtualMemoryOptions o)
    : VirtualMemory(checked_host_granule(o.granularity)), opts_(o) {
  fd_ = ::memfd_create("graphsafe-host-vm", 0);
  if (fd_ < 0) throw error("graphsafe: memfd_create failed: " + errno_text());
}

HostVirtualMemory::~HostVirtualMemory() {
  release_pool_noexcept();
  if (fd_ >= 0) ::close(fd_);
}

std::uintptr_t HostVirtualMemory::do_reserve(std::uint64_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw out_of_memory_error("graphsafe: host address space reservation of " + std::to_string(bytes) +
                              " bytes failed: " + errno_text());
  // Granule alignment: mmap gives page alignment only; over-reserve and trim when needed.
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (a % granularity() == 0) return a;
  ::munmap(p, bytes);
  const std::uint64_t over = bytes + granularity();
  p = ::mmap(nullptr, over, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw out_of_memory_error("graphsafe: host address space reservation of " + std::to_string(over) +
                              " bytes failed: " + errno_text());
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t aligned = (base + granularity() - 1) / granularity() * granularity();
  if (aligned > base) ::munmap(p, aligned - base);
  const std::uintptr_t end = base + over, want_end = aligned + bytes;
  if (end > want_end) ::munmap(reinterpret_cast<void*>(want_end), end - want_end);
  return aligned;
}

void HostVirtualMemory::do_unreserve(std::uintptr_t va, std::uint64_t bytes) noexcept {
  ::munmap(reinterpret_cast<void*>(va), bytes);
}

std::uint64_t HostVirtualMemory::do_create_chunk() {
  if (opts_.limit_bytes && (live_chunks_ + 1) * granularity() > opts_.limit_bytes)
    throw out_of_memory_error("graphsafe: host virtual memory cannot create a chunk: " +
                              std::to_string(live_chunks_ * granularity()) + " of its " +
                              std::to_string(opts_.limit_bytes) +
                              "-byte limit are held; shrink idle graphs or raise HostVirtualMemoryOptions::limit_bytes");
  std::uint64_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else {
    slot = fd_chunks_;
    if (::ftruncate(fd_, static_cast<off_t>((fd_chunks_ + 1) * granularity())) != 0)
      throw out_of_memory_error("graphsafe: host virtual memory could not grow its memfd: " + errno_text());
    ++fd_chunks_;
  }
  // Never hand out zeros: map it once to fill it.
  void* p = ::mmap(nullptr, granularity(), PROT_READ | PROT_WRITE, MAP_SHARED, fd_,
                   static_cast<off_t>(slot * granularity()));
  if (p == MAP_FAILED) {
    free_slots_.push_back(slot);
    throw out_of_memory_error("graphsafe: host virtual memory could not map a new chunk: " + errno_text());
  }
  std::memset(p, 0xA5, granularity());
  ::munmap(p, granularity());
  ++live_chunks_;
  return slot;
}

void HostVirtualMemory::do_release_chunk(std::uint64_t chunk) noexcept {
  // Give the pages back (the slot is reused by the next creation).
  ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(chunk * granularity()),
              static_cast<off_t>(granularity()));
  free_slots_.push_back(chunk);
  --live_chunks_;
}

void HostVirtualMemory::do_map(std::uintptr_t va, std::uint64_t chunk) {
  void* p = ::mmap(reinterpret_cast<void*>(va), granularity(), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd_,
                   static_cast<off_t>(chunk * granularity()));
  if (p == MAP_FAILED) throw out_of_memory_error("graphsafe: host virtual memory map failed: " + errno_text());
  std::lock_guard g(mapped_m_);
  mapped_[va] = chunk;
}

bool HostVirtualMemory::do_unmap(std::uintptr_t va) noexcept {
  // Back to an inaccessible reservation (MAP_FIXED replaces the shared mapping atomically).
  void* p = ::mmap(reinterpret_cast<void*>(va), granularity(), PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED,
         -1, 0);
  std::lock_guard g(mapped_m_);
  mapped_.erase(va);
  return p != MAP_FAILED;
}

bool HostVirtualMemory::is_mapped(const void* p, std::uint64_t bytes) const {
  if (bytes == 0) return true;
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t first = a / granularity() * granularity();
  std::lock_guard g(mapped_m_);
  for (std::uintptr_t v = first; v < a + bytes; v += granularity())
    if (!mapped_.contains(v)) return false;
  return true;
}

std::int64_t HostVirtualMemory::chunk_at(const void* p) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  std::lock_guard g(mapped_m_);
  const auto it = mapped_.find(a / granularity() * granularity());
  return it == mapped_.end() ? -1 : static_cast<std::int64_t>(it->second);
}

}  // namespace graphsafe
