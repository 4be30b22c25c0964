// ArenaObserver: what happens in an arena, told to whoever watches it (debug mode, tests, audits).
//
// The arena calls its observer at each event below and never asks it anything back, so watching
// cannot change placement or growth. With no observer attached every event costs one null check of
// ArenaCore::observer (predicted not taken); the eager request/release pair makes no virtual call.
// Observers are attached before the arena serves anything (ArenaCore::attach; the pointer is read
// without a lock). "Locked" below means the event runs under the arena's spin lock: such a handler
// must not block, call the backend, or re-enter the arena.
#pragma once

#include <graphsafe/stream.hpp>

#include <cstdint>
#include <memory>
#include <source_location>
#include <string>
#include <string_view>
#include <vector>

namespace graphsafe {
struct PlanEntry;
}

namespace graphsafe::detail {

class ArenaCore;
struct SessionState;
struct GraphState;

class ArenaObserver {
 public:
  virtual ~ArenaObserver() = default;

  // Memory became the arena's: a backend slab (heap = true; its allocation has completed on the
  // device, so it may be registered with tools) or a virtual growth reservation (heap = false). Locked.
  virtual void slab_added(std::uintptr_t /*addr*/, std::uint64_t /*bytes*/, bool /*heap*/) {}
  // A slab or reservation goes back (trim, arena or family death). Not locked.
  virtual void slab_removed(std::uintptr_t /*addr*/) noexcept {}
  // An eager request (or allocate(), opaque = true) was served `bytes` at `addr`. Not locked.
  virtual void request(std::uintptr_t /*addr*/, std::uint64_t /*bytes*/, std::string_view /*name*/,
                       const std::source_location& /*loc*/, Stream /*s*/, bool /*opaque*/) {}
  // An eager workspace at `addr` is released on `stream` (a stream tag), before its block goes back
  // to the free list. Not locked. deallocate() tells it before checking the pointer: one the arena
  // then refuses (not served eagerly, released twice) is told too.
  virtual void release(std::uintptr_t /*addr*/, void* /*stream*/) noexcept {}
  // A capture began on st.stream (after the backend started it; not for estimates). Not locked.
  virtual void capture_begin(SessionState& /*st*/) {}
  // A request, dimension or allocate() during capture was recorded as `e`. Not locked.
  virtual void captured_request(SessionState& /*st*/, const PlanEntry& /*e*/) {}
  // A captured request could not reuse a released range; `why` says what was not proven. Not locked.
  virtual void reuse_not_proven(SessionState& /*st*/, const PlanEntry& /*e*/, const std::string& /*why*/) {}
  // A capture ended: success with its region committed to the family, or abandoned. Not locked;
  // the graph or the abandoned region is already settled, so it cannot fail.
  virtual void capture_end(SessionState& /*st*/, bool /*success*/) noexcept {}
  // The graph of a successful capture exists (its plan, handle and region are set). Not locked.
  virtual void graph_created(SessionState& /*st*/, GraphState& /*g*/) {}
  // A replay of `g` on `s` is about to launch (guards passed, ordered after the family's
  // `last_stream`), then has launched. Under the family's replay mutex, not the arena's lock.
  virtual void replay_begin(GraphState& /*g*/, Stream /*s*/, void* /*last_stream*/, const std::source_location& /*loc*/) {}
  virtual void replay_end(GraphState& /*g*/, Stream /*s*/) {}
  // `g` is being destroyed (before its executable and region go back). Not locked.
  virtual void graph_destroyed(GraphState& /*g*/) noexcept {}
};

// More than one observer: each event goes to each, in the order they were attached.
class ObserverList final : public ArenaObserver {
 public:
  std::vector<std::unique_ptr<ArenaObserver>> list;

  void slab_added(std::uintptr_t addr, std::uint64_t bytes, bool heap) override {
    for (auto& o : list) o->slab_added(addr, bytes, heap);
  }
  void slab_removed(std::uintptr_t addr) noexcept override {
    for (auto& o : list) o->slab_removed(addr);
  }
  void request(std::uintptr_t addr, std::uint64_t bytes, std::string_view name, const std::source_location& loc,
               Stream s, bool opaque) override {
    for (auto& o : list) o->request(addr, bytes, name, loc, s, opaque);
  }
  void release(std::uintptr_t addr, void* stream) noexcept override {
    for (auto& o : list) o->release(addr, stream);
  }
  void capture_begin(SessionState& st) override {
    for (auto& o : list) o->capture_begin(st);
  }
  void captured_request(SessionState& st, const PlanEntry& e) override {
    for (auto& o : list) o->captured_request(st, e);
  }
  void reuse_not_proven(SessionState& st, const PlanEntry& e, const std::string& why) override {
    for (auto& o : list) o->reuse_not_proven(st, e, why);
  }
  void capture_end(SessionState& st, bool success) noexcept override {
    for (auto& o : list) o->capture_end(st, success);
  }
  void graph_created(SessionState& st, GraphState& g) override {
    for (auto& o : list) o->graph_created(st, g);
  }
  void replay_begin(GraphState& g, Stream s, void* last_stream, const std::source_location& loc) override {
    for (auto& o : list) o->replay_begin(g, s, last_stream, loc);
  }
  void replay_end(GraphState& g, Stream s) override {
    for (auto& o : list) o->replay_end(g, s);
  }
  void graph_destroyed(GraphState& g) noexcept override {
    for (auto& o : list) o->graph_destroyed(g);
  }
};

// Debug mode as an observer (src/debug_arena.cpp): canaries, NVTX registration, the capture report.
// Attaches one to `core` and returns it (owned by the core).
class DebugObserver;
DebugObserver* attach_debug_observer(ArenaCore& core);

}  // namespace graphsafe::detail
