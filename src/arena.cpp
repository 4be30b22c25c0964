#include "arena_core.hpp"
#include "environment.hpp"
#include "internal_access.hpp"
#include "virtual_commit.hpp"

#include <graphsafe/error.hpp>

#include <algorithm>
#include <charconv>
#include <cstdio>
#include <exception>
#include <mutex>

namespace graphsafe {
namespace detail {

std::string site_of(const std::source_location& loc) {
  // Built on every captured request: one allocation, no temporaries.
  std::string_view file = loc.file_name();
  if (auto slash = file.find_last_of('/'); slash != std::string_view::npos) file.remove_prefix(slash + 1);
  std::string_view fn = loc.function_name();
  const bool cut = fn.size() > 60;
  if (cut) fn = fn.substr(0, 57);
  char line[16];
  const auto [line_end, ec] = std::to_chars(line, line + sizeof line, loc.line());
  std::string s;
  s.reserve(file.size() + static_cast<std::size_t>(line_end - line) + fn.size() + 7);
  s.append(file).append(1, ':').append(line, line_end).append(" (").append(fn);
  if (cut) s.append("...");
  s.append(1, ')');
  return s;
}

void bad_byte_count(std::int64_t count, std::uint64_t element_bytes, std::string_view name) {
  if (count < 0)
    throw invalid_argument_error("graphsafe: request '" + std::string(name) + "' sized to " + std::to_string(count) +
                                 " elements; counts must be >= 0");
  if (element_bytes == 0)
    throw invalid_argument_error("graphsafe: request '" + std::string(name) + "' has element size 0; pass sizeof(T)");
  throw overflow_error("graphsafe: request '" + std::string(name) + "' needs " + std::to_string(count) + " x " +
                       std::to_string(element_bytes) + " bytes, which overflows 64-bit byte counts; check the extent");
}

void align_overflow(std::uint64_t x, std::uint64_t a) {
  throw overflow_error("graphsafe: " + std::to_string(x) + " bytes rounded up to a multiple of " + std::to_string(a) +
                       " does not fit in 64 bits; check the size");
}

void check_options(const ArenaOptions& o) {
  // The largest byte count the arena serves (reserve, allocate, requests): slab sizes up to it
  // round up to 2 MiB without wrapping.
  constexpr std::uint64_t kMaxBytes = 1ull << 62;
  // Bytes of guard behind every workspace in debug mode: far above any useful guard, and small
  // enough that a request plus its guard cannot overflow.
  constexpr std::uint64_t kMaxCanary = 1ull << 30;
  if (o.growth_bytes == 0 || o.growth_bytes > kMaxBytes)
    throw invalid_argument_error("graphsafe: ArenaOptions::growth_bytes = " + std::to_string(o.growth_bytes) +
                                 " is out of range; the minimum slab size must be >= 1 (slabs are rounded up to 2 MiB) "
                                 "and <= " + std::to_string(kMaxBytes) + " (2^62)");
  if (o.canary_bytes > kMaxCanary)
    throw invalid_argument_error("graphsafe: ArenaOptions::canary_bytes = " + std::to_string(o.canary_bytes) +
                                 " exceeds the limit " + std::to_string(kMaxCanary) +
                                 " (1 GiB) for the guard region behind each workspace; a few hundred bytes catch "
                                 "overruns");
  if (o.virtual_sharing != VirtualSharing::off && o.virtual_sharing != VirtualSharing::disjoint_lifetimes)
    throw invalid_argument_error("graphsafe: ArenaOptions::virtual_sharing = " +
                                 std::to_string(static_cast<int>(o.virtual_sharing)) +
                                 " is not a VirtualSharing value (off = 0, disjoint_lifetimes = 1)");
  if (o.virtual_sharing != VirtualSharing::off && !o.virtual_memory)
    throw invalid_argument_error("graphsafe: ArenaOptions::virtual_sharing = disjoint_lifetimes needs "
                                 "ArenaOptions::virtual_memory (physical chunks are shared between virtual ranges); "
                                 "set virtual_memory or leave virtual_sharing off");
}

// ---- deferred releases: one parked block per thread and arena -----------------------------------

std::mutex& deferred_registry_mutex() {
  static std::mutex m;
  return m;
}

namespace {
// The slots this thread owns; at thread exit each parked block goes back to its (live) arena.
struct ThreadSlots {
  std::vector<std::pair<std::uint64_t, std::shared_ptr<DeferredSlot>>> slots;
  ~ThreadSlots();
};
thread_local ThreadSlots thread_slots;
// The slot of the arena this thread used last (trivially destructible: no TLS guard on the hot path).
thread_local std::uint64_t last_arena_id = 0;
thread_local DeferredSlot* last_slot = nullptr;
// Set once thread_slots is destroyed: a workspace that dies later in the thread's exit (a
// thread_local one) releases under the lock.
thread_local bool thread_exiting = false;

ThreadSlots::~ThreadSlots() {
  thread_exiting = true;
  last_arena_id = 0;
  last_slot = nullptr;
  std::lock_guard g(deferred_registry_mutex());  // the arena cannot die meanwhile (its destructor takes it)
  for (auto& [id, s] : slots)
    if (s->core) s->core->detach_slot(*s);
}
}  // namespace

ArenaCore::ArenaCore(Backend& b, ArenaOptions o) : backend(b), opts(o), id(next_id()) {
  check_options(opts);
  if (env::debug()) opts.debug = true;  // GRAPHSAFE_DEBUG: debug mode for every arena
  if (opts.debug) {
    opts.always_check_capture = true;
    guard_bytes = opts.canary_bytes;
    debug = attach_debug_observer(*this);
  }
  regions = make_region_provider(*this);
}

void ArenaCore::attach(std::unique_ptr<ArenaObserver> o) {
  observers_.list.push_back(std::move(o));
  observer = observers_.list.size() == 1 ? observers_.list.front().get() : &observers_;
}

std::uint64_t ArenaCore::next_id() {
  static std::atomic<std::uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

inline DeferredSlot* ArenaCore::my_slot() noexcept {
  if (last_arena_id == id) [[likely]] return last_slot;
  return my_slot_slow();
}

DeferredSlot* ArenaCore::my_slot_slow() noexcept {
  if (thread_exiting) return nullptr;
  try {
    auto& mine = thread_slots.slots;
    auto it = std::find_if(mine.begin(), mine.end(), [&](const auto& e) { return e.first == id; });
    if (it == mine.end()) {
      {
        // Drop the slots of arenas that died (their ids are never reused).
        std::lock_guard g(deferred_registry_mutex());
        std::erase_if(mine, [](const auto& e) { return e.second->core == nullptr; });
      }
      mine.reserve(mine.size() + 1);  // nothing below throws once the slot is registered
      auto slot = std::make_shared<DeferredSlot>();
      slot->core = this;
      {
        std::lock_guard g(lock);
        deferred_slots.push_back(slot);
      }
      mine.emplace_back(id, std::move(slot));
      it = std::prev(mine.end());
    }
    last_arena_id = id;
    last_slot = it->second.get();
    return last_slot;
  } catch (...) {
    return nullptr;  // no memory for a slot: release under the lock
  }
}

void ArenaCore::finish_release(Block* b) {
  eager_bytes -= b->size;
  --eager_blocks;
  fl.release_eager(b, b->stream);
}

void ArenaCore::collect_deferred() {
  for (const auto& s : deferred_slots)
    if (Block* b = s->pending.load(std::memory_order_acquire)) {
      s->pending.store(nullptr, std::memory_order_relaxed);
      finish_release(b);
    }
}

void ArenaCore::detach_slot(DeferredSlot& s) noexcept {
  std::lock_guard g(lock);
  if (Block* b = s.pending.load(std::memory_order_acquire)) {
    s.pending.store(nullptr, std::memory_order_relaxed);
    finish_release(b);
  }
  std::erase_if(deferred_slots, [&](const auto& p) { return p.get() == &s; });
  s.core = nullptr;
}

ArenaCore::~ArenaCore() {
  {
    // Threads that still own a slot here drop it when they next look (or exit).
    std::lock_guard g(deferred_registry_mutex());
    for (const auto& s : deferred_slots) s->core = nullptr;
  }
  // Slabs go back to the backend. Graphs and sessions hold the core alive, so none remain here;
  // eager workspaces must not outlive their arena (documented on Workspace).
  std::vector<std::pair<std::uintptr_t, std::uint64_t>> slabs;
  fl.for_each_block([&](const Slab& s, const Block& b) {
    if (&b == &s.blocks.front()) slabs.emplace_back(s.addr, s.size);
  });
  for (auto [addr, size] : slabs) {
    if (observer) observer->slab_removed(addr);
    try {
      backend.free_slab(reinterpret_cast<void*>(addr), size, Stream(static_cast<cudaStream_t>(nullptr)));
    } catch (...) {
    }
  }
}

SessionState* ArenaCore::session_for_query(Stream s) {
  const CaptureInfo ci = backend.capture_info(s);
  if (!ci.active) {
    if (ci.invalidated)
      throw capture_state_error("graphsafe: the capture on this stream has been invalidated by an earlier illegal call; "
                                "end it and capture again (the first CUDA error of the capture names the call)");
    return nullptr;
  }
  std::lock_guard g(lock);
  for (SessionState* st : sessions)
    if (st->capture_id == ci.id) return st;
  throw capture_state_error("graphsafe: workspace requested on a stream that is capturing (capture id " +
                            std::to_string(ci.id) +
                            ") outside graphsafe; start the capture with graphsafe::capture or CaptureSession so "
                            "the request is sized by its policy, recorded in the plan and kept alive for the graph");
}

void* ArenaCore::new_slab(std::uint64_t bytes, Stream s) {
  void* p = backend.allocate_slab(bytes, s);
  // Observers are told of slabs whose allocation has happened (debug mode registers them with the
  // NVTX Memory API; compute-sanitizer only accepts the range once the stream-ordered allocation ran).
  if (observer) [[unlikely]] backend.synchronize(s);
  return p;
}

Block* ArenaCore::take_eager(std::uint64_t bytes, Stream s, bool index) {
  Block* b;
  std::uint64_t largest = 0;  // for the error message: read under the lock, as the search saw it
  DeferredSlot* slot = my_slot();
  {
    std::lock_guard g(lock);
    // This thread's parked release goes back first (one lock for the release and this request).
    if (Block* d = slot ? slot->pending.load(std::memory_order_acquire) : nullptr) {
      slot->pending.store(nullptr, std::memory_order_relaxed);
      finish_release(d);
    }
    // A block of this size released on this stream (the serving loop's steady state), else best fit.
    b = fl.take_cached(bytes, stream_tag(s), index);
    if (!b && deferred_slots.size() > 1) {
      // Nothing cached for us: other threads' parked releases may hold the best fit.
      collect_deferred();
      b = fl.take_cached(bytes, stream_tag(s), index);
    }
    if (b) {
      eager_bytes += b->size;
      ++eager_blocks;
    } else if ((b = fl.take_best_fit(bytes))) {
      eager_bytes += b->size;
      ++eager_blocks;
      if (index) fl.index_used(b);  // raw pointers are returned by address: one lock for both
    } else {
      largest = fl.largest_free();
    }
  }
  if (!b) {
    if (!opts.grow_on_demand)
      throw out_of_memory_error("graphsafe: arena has no free block of " + std::to_string(bytes) +
                                " bytes (largest free " + std::to_string(largest) +
                                ") and grow_on_demand is off; reserve more with arena.reserve(bytes, stream)");
    const std::uint64_t slab = align_up(std::max(bytes, opts.growth_bytes), 2ull << 20);
    void* p = new_slab(slab, s);  // throws out_of_memory_error naming the size
    std::lock_guard g(lock);
    fl.add_slab(reinterpret_cast<std::uintptr_t>(p), slab, stream_tag(s));
    if (observer) observer->slab_added(reinterpret_cast<std::uintptr_t>(p), slab, true);
    b = fl.take_best_fit(bytes);
    eager_bytes += b->size;
    ++eager_blocks;
    if (index) fl.index_used(b);
  }
  // A block released on another stream may still be in use there: order this stream after it.
  if (b->stream && b->stream != stream_tag(s)) backend.order_after(s, tagged_stream(b->stream));
  b->stream = stream_tag(s);
  return b;
}

void ArenaCore::release_captured(std::uint64_t serial, void* stream) noexcept {
  if (active_sessions.load(std::memory_order_acquire) == 0) return;  // the graph owns it now
  try {
    // Each placement's serials are its own: the owner is found without asking any for its lock.
    SessionState* owner = nullptr;
    {
      std::lock_guard g(lock);
      for (SessionState* st : sessions)
        if (st->placement->owns(serial)) owner = st;
    }
    if (owner) owner->placement->release(*owner, serial, stream);
  } catch (...) {
    // The range stays reserved for the graph (as it would without reuse): nothing is lost.
  }
}

void ArenaCore::record(SessionState& st, PlanEntry e, SizingDecision& d, const Extent* need, const Bindings& b) {
  e.replay_safe = d.replay_safe;
  if (need) {
    e.need = *need;
    e.needed_at_capture = need->evaluate(b);
  }
  if (!d.replay_safe && need) {
    std::string syms;
    for (Symbol s : need->dynamic_symbols()) syms += (syms.empty() ? "" : ", ") + b.describe(s);
    std::string msg = "size of '" + e.name + "' depends on " + syms + " through " + need->to_string() + " and policy " +
                      e.policy + " gives no bound for later replays (" + d.note +
                      "); a replay that needs more will be refused by its guard. Fix: size it with capacity_bound "
                      "(declare capacities) or static_query_bound";
    if (opts.refuse_unsafe_capture) throw policy_refusal("graphsafe: capture refused: " + msg);
    st.plan.add_finding({e.name, e.site, std::move(msg)});
  }
  e.note = std::move(d.note);  // the decision is the caller's, read no more
  if (observer) [[unlikely]] observer->captured_request(st, e);
  st.plan.add(std::move(e));
}

Workspace ArenaCore::request(Stream s, std::string_view name, const Extent& need, std::uint64_t element_bytes,
                             const SizingPolicy& policy, const Bindings& b, const std::source_location& loc,
                             const Footprint* touched) {
  SessionState* st = session_for(s);
  SizingDecision d = policy.size(name, need, b, st != nullptr);
  const std::uint64_t bytes = checked_bytes(d.count, element_bytes, name);
  if (!st) {
    if (bytes == 0) return make_workspace(nullptr, nullptr, 0, d.count, s, false);
    Block* blk = take_eager(align_up(bytes + guard_bytes, kAlignment), s);
    if (observer) [[unlikely]] observer->request(blk->addr, bytes, name, loc, s, false);
    return make_workspace(blk, reinterpret_cast<void*>(blk->addr), bytes, d.count, s, false);
  }
  return request_captured(*st, s, name, need, element_bytes, policy, b, loc, touched, d, bytes);
}

Workspace ArenaCore::request_captured(SessionState& st, Stream s, std::string_view name, const Extent& need,
                                      std::uint64_t element_bytes, const SizingPolicy& policy, const Bindings& b,
                                      const std::source_location& loc, const Footprint* touched,
                                      SizingDecision& d, std::uint64_t bytes) {
  // Debug mode: a guard region follows the workspace (guard_bytes is 0 otherwise).
  Placed p = st.placement->request(st, {bytes + guard_bytes, kAlignment, s, name, observer != nullptr});
  const std::uint64_t offset = p.offset;
  // Virtual growth: map the capture-time footprint (and the guard region) behind the range.
  if (st.virt) [[unlikely]] virtual_place(st, offset, bytes, guard_bytes, element_bytes, need, touched, b, name);
  PlanEntry e;
  e.kind = PlanEntry::Kind::workspace;
  e.name = std::string(name);
  e.policy = std::string(policy.name());
  e.reserved = d.count;
  e.element_bytes = element_bytes;
  e.bytes = bytes;
  e.offset = offset;
  e.site = site_of(loc);
  if (!p.why_not.empty()) [[unlikely]] observer->reuse_not_proven(st, e, p.why_not);
  record(st, std::move(e), d, &need, b);
  Workspace w = make_workspace(nullptr, reinterpret_cast<void*>(st.base + offset), bytes, d.count, s, true);
  w.block_ = reinterpret_cast<void*>(static_cast<std::uintptr_t>(p.serial));  // the placement's id of its range
  return w;
}

std::int64_t ArenaCore::dimension(Stream s, std::string_view name, const Extent& need, const SizingPolicy& policy,
                                  const Bindings& b, const std::source_location& loc) {
  SessionState* st = session_for(s);
  SizingDecision d = policy.size(name, need, b, st != nullptr);
  if (st) {
    PlanEntry e;
    e.kind = PlanEntry::Kind::dimension;
    e.name = std::string(name);
    e.policy = std::string(policy.name());
    e.reserved = d.count;
    e.site = site_of(loc);
    record(*st, std::move(e), d, &need, b);
  }
  return d.count;
}

void* ArenaCore::allocate(Stream s, std::uint64_t bytes, std::uint64_t alignment, const std::source_location& loc) {
  if (alignment == 0 || (alignment & (alignment - 1)) != 0 || alignment > kAlignment)
    throw invalid_argument_error("graphsafe: alignment " + std::to_string(alignment) +
                                 " is not a power of two <= 256; graphsafe serves 256-byte aligned blocks (as "
                                 "cudaMalloc does) -- over-allocate and align inside the block for more");
  if (bytes > (1ull << 62))
    throw overflow_error("graphsafe: allocate(" + std::to_string(bytes) + " bytes) is larger than any device; check the size");
  if (SessionState* st = session_for(s)) [[unlikely]]
    return allocate_captured(*st, s, bytes, alignment, loc);
  Block* blk = take_eager(align_up(std::max<std::uint64_t>(bytes, 1) + guard_bytes, kAlignment), s, true);
  if (observer) [[unlikely]] observer->request(blk->addr, bytes, "<opaque " + std::to_string(bytes) + " B>", loc, s, true);
  return reinterpret_cast<void*>(blk->addr);
}

void* ArenaCore::allocate_captured(SessionState& st, Stream s, std::uint64_t bytes, std::uint64_t alignment,
                                   const std::source_location& loc) {
  const Placed p =
      st.placement->request(st, {std::max<std::uint64_t>(bytes, 1) + guard_bytes, alignment, s, "<opaque>", observer != nullptr});
  const std::uint64_t offset = p.offset;
  if (st.virt) [[unlikely]] virtual_place_bytes(st, offset, std::max<std::uint64_t>(bytes, 1) + guard_bytes, "<opaque>");
  PlanEntry e;
  e.kind = PlanEntry::Kind::opaque;
  e.name = "<opaque " + std::to_string(bytes) + " B>";
  e.policy = "opaque";
  e.reserved = static_cast<std::int64_t>(bytes);
  e.bytes = bytes;
  e.offset = offset;
  e.replay_safe = true;  // nothing to check: no extent says what it depends on
  e.note = "size_t request: graphsafe cannot tell what this size depends on";
  e.site = site_of(loc);
  if (!p.why_not.empty()) [[unlikely]] observer->reuse_not_proven(st, e, p.why_not);
  if (observer) [[unlikely]] observer->captured_request(st, e);
  st.plan.add(std::move(e));
  return reinterpret_cast<void*>(st.base + offset);
}

void ArenaCore::deallocate(Stream s, void* p, std::uint64_t bytes) {
  if (!p) return;
  const auto addr = reinterpret_cast<std::uintptr_t>(p);
  if (active_sessions.load(std::memory_order_acquire) > 0) {
    SessionState* owner = nullptr;
    {
      std::lock_guard g(lock);
      for (SessionState* st : sessions)
        if (addr >= st->base && addr < st->base + st->limit) owner = st;
    }
    if (owner) {
      // Served by this capture: its range may be reused by the capture's later requests. A pointer
      // of a live graph of the family (or one released already) stays the graph's.
      std::uint64_t range = 0;
      if (const std::uint64_t serial = owner->placement->serial_at(*owner, addr - owner->base, range)) {
        const std::uint64_t held = range - guard_bytes;  // the range taken, 256-byte aligned
        if (bytes > held)
          throw invalid_argument_error("graphsafe: deallocate of " + std::to_string(bytes) + " bytes but the block at " +
                                       std::to_string(addr) + " holds " + std::to_string(held) +
                                       "; pass the size given to allocate()");
        release_captured(serial, s.handle());
      }
      return;
    }
  }
  // Debug mode checks the guard here (synchronizes the stream: not under the spin lock). Told of a
  // pointer this arena did not serve eagerly too; the checks below refuse it.
  if (observer) [[unlikely]] observer->release(addr, stream_tag(s));
  std::lock_guard g(lock);
  Block* b = fl.find_used(addr);
  if (!b) {
    // Could be a block of a live graph's region (freed after capture): also not ours to free.
    throw invalid_argument_error("graphsafe: deallocate(" + std::to_string(addr) + ", " + std::to_string(bytes) +
                                 " bytes): pointer was not served by this arena's allocate() or was already "
                                 "released (double release?); nothing was changed");
  }
  if (bytes > b->size)
    throw invalid_argument_error("graphsafe: deallocate of " + std::to_string(bytes) + " bytes but the block at " +
                                 std::to_string(addr) + " holds " + std::to_string(b->size) +
                                 "; pass the size given to allocate()");
  eager_bytes -= b->size;
  --eager_blocks;
  fl.release_eager(b, stream_tag(s));  // leaves the used tree unless it is cached
}

void ArenaCore::release(Workspace& w) noexcept {
  if (w.captured_) [[unlikely]] {
    if (w.block_) release_captured(reinterpret_cast<std::uintptr_t>(w.block_), w.stream_);
    return;
  }
  if (!w.block_) return;
  auto* b = static_cast<Block*>(w.block_);
  b->stream = w.stream_;  // the block is still this workspace's: nobody else reads it until it is back
  if (observer) [[unlikely]] {
    observer->release(b->addr, w.stream_);  // then back under the lock: an observed release is never parked
  } else {
    // Park it in this thread's slot when that is empty: no lock. The next request of this thread
    // (or anyone needing the whole free state) puts it back under the lock it takes anyway.
    DeferredSlot* slot = my_slot();
    if (slot && !slot->pending.load(std::memory_order_relaxed)) {
      slot->pending.store(b, std::memory_order_release);
      return;
    }
  }
  std::lock_guard g(lock);
  finish_release(b);
}

void ArenaCore::reserve(std::uint64_t bytes, Stream s) {
  // Above 2^62 the slab size would wrap to 0 when rounded up to 2 MiB (a zero-byte slab).
  if (bytes > (1ull << 62))
    throw overflow_error("graphsafe: reserve(" + std::to_string(bytes) + " bytes) is larger than any device (limit " +
                         std::to_string(1ull << 62) + "); check the size");
  if (backend.capture_info(s).active)
    throw capture_state_error("graphsafe: reserve(" + std::to_string(bytes) +
                              ") on a capturing stream; reserve before the capture starts (growth during capture "
                              "would not be part of the graph)");
  {
    std::lock_guard g(lock);
    collect_deferred();
    fl.flush_cache();
    if (fl.largest_free() >= bytes) return;
  }
  const std::uint64_t slab = align_up(std::max<std::uint64_t>(bytes, kAlignment), 2ull << 20);
  void* p = new_slab(slab, s);
  std::lock_guard g(lock);
  fl.add_slab(reinterpret_cast<std::uintptr_t>(p), slab, stream_tag(s));
  if (observer) observer->slab_added(reinterpret_cast<std::uintptr_t>(p), slab, true);
}

void ArenaCore::make_free_blocks_ready(Stream s) {
  // Free blocks may still be in use by work on the streams that released them: wait for each of
  // those streams (and `s`) so their blocks can coalesce across streams. Streams capturing right
  // now cannot be waited for (illegal during capture); their blocks keep their stream.
  std::vector<void*> streams{stream_tag(s)};
  std::uint64_t horizon;  // a block released after this may be in use by work queued after the waits
  {
    std::lock_guard g(lock);
    collect_deferred();
    fl.flush_cache();  // cached blocks are free blocks with a release stream too
    horizon = fl.releases();
    fl.for_each_block([&](const Slab&, const Block& b) {
      if (b.state == BlockState::free && b.stream &&
          std::find(streams.begin(), streams.end(), b.stream) == streams.end())
        streams.push_back(b.stream);
    });
  }
  std::vector<void*> synced;
  for (void* st : streams) {
    const Stream x = tagged_stream(st);
    if (backend.capture_info(x).active) continue;
    backend.synchronize(x);
    synced.push_back(st);
  }
  std::lock_guard g(lock);
  fl.mark_ready(synced, horizon);
}

void ArenaCore::trim(Stream s) {
  if (backend.capture_info(s).active)
    throw capture_state_error("graphsafe: trim() on a capturing stream; trim outside capture");
  make_free_blocks_ready(s);
  std::vector<std::pair<std::uintptr_t, std::uint64_t>> slabs;
  {
    std::lock_guard g(lock);
    collect_deferred();  // releases parked since make_free_blocks_ready (remove_free_slabs flushes the cache)
    slabs = fl.remove_free_slabs();
  }
  // A slab the backend fails to free stays the arena's (back in the free list, as it was) and the
  // rest are still freed; then the first error is rethrown. Nothing is lost either way.
  std::vector<std::pair<std::uintptr_t, std::uint64_t>> kept;
  kept.reserve(slabs.size());
  std::exception_ptr first;
  for (auto [addr, size] : slabs) {
    try {
      if (observer) observer->slab_removed(addr);
      backend.free_slab(reinterpret_cast<void*>(addr), size, s);
    } catch (...) {
      if (!first) first = std::current_exception();
      kept.emplace_back(addr, size);
    }
  }
  if (!first) return;
  {
    std::lock_guard g(lock);
    for (auto [addr, size] : kept) {
      fl.add_slab(addr, size, s.handle());
      if (observer) observer->slab_added(addr, size, true);
    }
  }
  std::rethrow_exception(first);
}

void ArenaCore::begin_slab_capture(SessionState& st) {
  // Nothing free at all (e.g. another capture holds the largest block): grow now, while the stream
  // is still eager. A capture itself never calls the upstream allocator.
  bool nothing_free;
  {
    std::lock_guard g(lock);
    collect_deferred();
    fl.flush_cache();  // the capture wants coalesced ranges (the largest block, the block after a region)
    // Refuse a second capture of the family before growing: a refused call changes nothing.
    if (st.family->capturing)
      throw capture_state_error("graphsafe: family '" + st.family->name +
                                "' is already capturing a graph; capture the graphs of one family one after another");
    // A family re-captured after its graphs died knows how much its largest plan took: when
    // fragmentation left no free range that large, grow now rather than fail mid-capture.
    nothing_free = !st.family->region &&
                   (fl.free_blocks() == 0 || (st.family->largest_plan > 0 && fl.largest_free() < st.family->largest_plan));
  }
  if (nothing_free && st.family->largest_plan > 0) {
    // Blocks released on different streams do not coalesce until those streams are waited for:
    // do that first (capture setup, not a hot path) and grow only if the range is still missing.
    make_free_blocks_ready(st.stream);
    std::lock_guard g(lock);
    nothing_free = fl.largest_free() < st.family->largest_plan;
  }
  if (nothing_free && opts.grow_on_demand) {
    const std::uint64_t slab = align_up(std::max(opts.growth_bytes, st.family->largest_plan), 2ull << 20);
    void* p = new_slab(slab, st.stream);
    std::lock_guard g(lock);
    fl.add_slab(reinterpret_cast<std::uintptr_t>(p), slab, stream_tag(st.stream));
    if (observer) observer->slab_added(reinterpret_cast<std::uintptr_t>(p), slab, true);
  }
  std::lock_guard g(lock);
  Family& f = *st.family;
  if (f.capturing)
    throw capture_state_error("graphsafe: family '" + f.name +
                              "' is already capturing a graph; capture the graphs of one family one after another");
  if (f.region) {
    st.base = f.region->addr;
    st.limit = f.region->size;
    if (Block* n = fl.next_in_slab(f.region); n && n->state == BlockState::free) {
      fl.take(n);
      st.next_held = n;
      st.limit += n->size;
    }
  } else {
    Block* b = fl.take_largest();
    if (!b)
      throw out_of_memory_error("graphsafe: the arena holds no free memory to capture into; call "
                                "arena.reserve(bytes, stream) before capturing (size it with a warm-up pass)");
    st.provisional = b;
    st.base = b->addr;
    st.limit = b->size;
  }
  f.capturing = true;
}

void ArenaCore::end_slab_capture(SessionState& st, bool success) {
  std::lock_guard g(lock);
  Family& f = *st.family;
  f.capturing = false;
  const std::uint64_t used = align_up(st.bump, kAlignment);
  if (!success) {
    if (st.provisional) fl.give_back(st.provisional, stream_tag(st.stream));
    if (st.next_held) fl.give_back(st.next_held, stream_tag(st.stream));
    st.provisional = st.next_held = nullptr;
    // The family's last graph may have died while this capture held its region (graph_destroyed
    // leaves a capturing family's region alone): nobody holds it now, so it goes back.
    if (f.graphs == 0 && f.region) {
      region_bytes -= f.region->size;
      region_peak_live -= f.peak_live;
      --families_with_region;
      f.region->state = BlockState::used;
      fl.give_back(f.region, f.last_stream ? f.last_stream : stream_tag(st.stream));
      f.region = nullptr;
    }
    return;
  }
  const bool had_region = f.region != nullptr;
  if (st.provisional) {
    if (used == 0) {
      fl.give_back(st.provisional, stream_tag(st.stream));
    } else {
      fl.trim_tail(st.provisional, used);
      st.provisional->state = BlockState::region;
      f.region = st.provisional;
      region_bytes += used;
      ++families_with_region;
    }
  } else {
    const std::uint64_t have = f.region->size;
    if (st.next_held) fl.give_back(st.next_held, stream_tag(st.stream));
    if (used > have) {
      fl.extend(f.region, used - have);  // the range was held during capture, so it is still free
      region_bytes += used - have;
    }
  }
  st.provisional = st.next_held = nullptr;
  f.largest_plan = std::max(f.largest_plan, used);
  f.sum_plans += used;
  // The family's lower bound follows its region (the largest of its members').
  const std::uint64_t peak = std::max(f.peak_live, st.plan.peak_live_bytes());
  if (f.region) region_peak_live += peak - (had_region ? f.peak_live : 0);
  f.peak_live = peak;
}

void ArenaCore::graph_destroyed(Family& f, void* stream) noexcept {
  std::lock_guard g(lock);
  --live_graphs;
  if (--f.graphs == 0 && !f.capturing && f.region) {
    region_bytes -= f.region->size;
    region_peak_live -= f.peak_live;
    --families_with_region;
    f.region->state = BlockState::used;
    fl.give_back(f.region, f.last_stream ? f.last_stream : stream);
    f.region = nullptr;
  }
}

}  // namespace detail

// ---- Workspace ---------------------------------------------------------------------------------

void Workspace::release_and_clear() noexcept {
  core_->release(*this);
  core_ = nullptr;
  block_ = ptr_ = stream_ = nullptr;
  bytes_ = 0;
  count_ = 0;
  captured_ = false;
}

// ---- CaptureFamily -----------------------------------------------------------------------------

namespace {
// A family's figures change under its arena's lock (captures, graphs dying on any thread). Once the
// arena is gone so are its graphs and captures, and nothing changes them.
template <class F>
std::uint64_t read_family(const detail::Family& f, F get) {
  if (auto core = f.arena.lock()) {
    std::lock_guard g(core->lock);
    return get(f);
  }
  return get(f);
}
}  // namespace

const std::string& CaptureFamily::name() const { return f_->name; }
std::uint64_t CaptureFamily::region_bytes() const {
  return read_family(*f_, [](const detail::Family& f) { return f.region ? f.region->size : 0; });
}
std::uint64_t CaptureFamily::graphs() const {
  return read_family(*f_, [](const detail::Family& f) { return f.graphs; });
}
std::uint64_t CaptureFamily::largest_plan_bytes() const {
  return read_family(*f_, [](const detail::Family& f) { return f.largest_plan; });
}
std::uint64_t CaptureFamily::sum_of_plan_bytes() const {
  return read_family(*f_, [](const detail::Family& f) { return f.sum_plans; });
}
std::uint64_t CaptureFamily::peak_live_bytes() const {
  return read_family(*f_, [](const detail::Family& f) { return f.peak_live; });
}

// ---- Arena -------------------------------------------------------------------------------------

Arena::Arena(Backend& backend, ArenaOptions opts) : core_(std::make_shared<detail::ArenaCore>(backend, opts)) {}
Arena::~Arena() = default;

void Arena::reserve(std::uint64_t bytes, Stream s) { core_->reserve(bytes, s); }
Workspace Arena::request(Stream s, std::string_view name, const Extent& need, std::uint64_t element_bytes,
                         const SizingPolicy& policy, const Bindings& b, std::source_location loc) {
  return core_->request(s, name, need, element_bytes, policy, b, loc);
}
std::int64_t Arena::dimension(Stream s, std::string_view name, const Extent& need, const SizingPolicy& policy,
                              const Bindings& b, std::source_location loc) {
  return core_->dimension(s, name, need, policy, b, loc);
}
void* Arena::allocate(Stream s, std::uint64_t bytes, std::uint64_t alignment, std::source_location loc) {
  return core_->allocate(s, bytes, alignment, loc);
}
void Arena::deallocate(Stream s, void* p, std::uint64_t bytes) { core_->deallocate(s, p, bytes); }

CaptureFamily Arena::family(std::string name) {
  auto f = std::make_shared<detail::Family>();
  f->name = std::move(name);
  f->arena_id = core_->id;
  f->arena = core_;
  return family_handle(std::move(f));
}

void Arena::trim(Stream s) { core_->trim(s); }

ArenaStats Arena::stats() const {
  std::lock_guard g(core_->lock);
  // Report the coalesced state: cached blocks (released, not yet coalesced) are free memory.
  core_->collect_deferred();
  core_->fl.flush_cache();
  ArenaStats st;
  st.slab_bytes = core_->fl.slab_bytes();
  st.slabs = core_->fl.slabs();
  st.free_bytes = core_->fl.free_bytes();
  st.largest_free = core_->fl.largest_free();
  st.eager_bytes = core_->eager_bytes;
  st.eager_blocks = core_->eager_blocks;
  st.region_bytes = core_->region_bytes;
  st.region_peak_live_bytes = core_->region_peak_live;
  st.families = core_->families_with_region;
  st.live_graphs = core_->live_graphs;
  st.active_captures = static_cast<std::uint64_t>(core_->active_sessions.load());
  return st;
}

Backend& Arena::backend() const { return core_->backend; }
const ArenaOptions& Arena::options() const { return core_->opts; }

}  // namespace graphsafe
