// ChunkRegistrar: one registration per mapped chunk, deferred out of captures, bounded.
#include <graphsafe/error.hpp>
#include <graphsafe/nccl/registrar.hpp>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <string>

namespace graphsafe::nccl {

namespace {
std::atomic<std::uint64_t> g_process_live{0};

std::string hex(std::uintptr_t a) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(a));
  return buf;
}
}  // namespace

ChunkRegistrar::ChunkRegistrar(std::unique_ptr<RegistrationCalls> calls, std::uint64_t granularity,
                               RegistrarOptions options)
    : calls_(std::move(calls)), granule_(granularity), opts_(options) {
  if (!calls_) throw invalid_argument_error("graphsafe::nccl: ChunkRegistrar needs registration calls (got null)");
  if (granule_ == 0) throw invalid_argument_error("graphsafe::nccl: ChunkRegistrar granularity 0; pass the VirtualMemory's");
  if (opts_.max_registrations == 0)
    throw invalid_argument_error("graphsafe::nccl: RegistrarOptions::max_registrations is 0; it must be at least 1");
}

ChunkRegistrar::~ChunkRegistrar() {
  std::lock_guard g(m_);
  for (auto& [va, h] : handles_) {
    if (!calls_->deregister(h)) ++st_.deregister_failures;
    ++st_.deregistrations;
  }
  g_process_live.fetch_sub(handles_.size(), std::memory_order_relaxed);
  handles_.clear();
}

void ChunkRegistrar::register_chunks(const std::vector<std::uintptr_t>& chunks) {
  std::size_t done = 0;
  try {
    for (; done < chunks.size(); ++done) {
      if (VirtualMemory::capture_time_maps()) ++st_.during_capture;
      void* h = calls_->register_range(reinterpret_cast<void*>(chunks[done]), granule_);
      ++st_.registrations;
      handles_.emplace(chunks[done], h);
    }
  } catch (...) {
    for (std::size_t i = 0; i < done; ++i) {  // all or nothing: the caller unmaps or keeps them deferred
      const auto it = handles_.find(chunks[i]);
      if (!calls_->deregister(it->second)) ++st_.deregister_failures;
      ++st_.deregistrations;
      handles_.erase(it);
    }
    throw;
  }
  g_process_live.fetch_add(chunks.size(), std::memory_order_relaxed);
}

void ChunkRegistrar::mapped(std::uintptr_t va, std::uint64_t count, bool in_capture) {
  std::lock_guard g(m_);
  const std::uint64_t held = handles_.size() + pending_.size();
  if (held + count > opts_.max_registrations)
    throw capacity_error("graphsafe::nccl: mapping " + std::to_string(count) + " chunk(s) at " + hex(va) + " would hold " +
                         std::to_string(held + count) + " chunk registrations; the limit is " +
                         std::to_string(opts_.max_registrations) +
                         " (RegistrarOptions::max_registrations): shrink idle graphs or raise the limit");
  std::vector<std::uintptr_t> chunks(count);
  for (std::uint64_t i = 0; i < count; ++i) chunks[i] = va + i * granule_;
  if (in_capture) {
    if (opts_.capture_maps == CaptureMaps::refuse)
      throw capture_state_error("graphsafe::nccl: " + std::to_string(count) + " chunk(s) at " + hex(va) +
                                " were mapped while a graph was being captured, and registering them there is "
                                "refused (CaptureMaps::refuse); capture the family once before, so its chunks are "
                                "mapped and registered, or use CaptureMaps::defer and flush() after the capture");
    pending_.insert(pending_.end(), chunks.begin(), chunks.end());
    st_.deferred += count;
    return;
  }
  // Outside a capture: earlier deferred chunks first (mapping order), then these.
  if (!pending_.empty()) {
    register_chunks(pending_);
    pending_.clear();
  }
  register_chunks(chunks);
}

void ChunkRegistrar::unmapping(std::uintptr_t va, std::uint64_t count) noexcept {
  std::lock_guard g(m_);
  const std::uintptr_t end = va + count * granule_;
  std::erase_if(pending_, [&](std::uintptr_t c) { return c >= va && c < end; });
  auto it = handles_.lower_bound(va);
  std::uint64_t dropped = 0;
  while (it != handles_.end() && it->first < end) {
    if (!calls_->deregister(it->second)) ++st_.deregister_failures;
    ++st_.deregistrations;
    ++dropped;
    it = handles_.erase(it);
  }
  g_process_live.fetch_sub(dropped, std::memory_order_relaxed);
}

std::uint64_t ChunkRegistrar::flush() {
  std::lock_guard g(m_);
  if (VirtualMemory::capture_time_maps())
    throw capture_state_error("graphsafe::nccl: ChunkRegistrar::flush() called while a capture maps chunks; "
                              "call it after the capture ends");
  const std::uint64_t n = pending_.size();
  register_chunks(pending_);
  pending_.clear();
  return n;
}

bool ChunkRegistrar::registered(const void* p, std::uint64_t bytes) const {
  const auto a = reinterpret_cast<std::uintptr_t>(p);
  if (bytes == 0) return true;
  std::lock_guard g(m_);
  for (std::uintptr_t c = a / granule_ * granule_; c < a + bytes; c += granule_)
    if (!handles_.contains(c)) return false;
  return true;
}

RegistrarStats ChunkRegistrar::stats() const {
  std::lock_guard g(m_);
  RegistrarStats s = st_;
  s.live = handles_.size();
  s.pending = pending_.size();
  return s;
}

std::uint64_t ChunkRegistrar::process_live() { return g_process_live.load(std::memory_order_relaxed); }

}  // namespace graphsafe::nccl
