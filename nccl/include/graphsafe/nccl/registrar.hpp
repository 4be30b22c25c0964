// ChunkRegistrar: registers an arena's virtual-memory chunks with a communication library, once per
// mapped chunk, never while a graph is being captured.
//
//   auto vm = std::make_shared<graphsafe::CudaVirtualMemory>(graphsafe::CudaVirtualMemoryOptions{.shareable = true});
//   auto reg = graphsafe::nccl::attach_nccl(*vm, comm);     // <graphsafe/nccl/nccl.hpp>
//   graphsafe::Arena arena(backend, {.virtual_memory = vm});
//   auto g = graphsafe::capture(arena, s, b, step);          // chunks mapped here are deferred
//   reg->flush();                                            // ... and registered here, outside capture
//
// It listens to a VirtualMemory (ChunkListener): each chunk mapped outside a capture is registered
// at once; a chunk the arena maps while capturing (its capture-time footprint) is deferred and
// registered by flush() or by the next mapping made outside a capture, or refused
// (CaptureMaps::refuse). Growth maps new chunks at fixed addresses, so only those are registered;
// an unmapped chunk is deregistered before it goes. Live registrations are bounded
// (RegistrarOptions::max_registrations): a mapping past the bound is refused, with nothing mapped.
// This header does not include NCCL: the registration calls are a RegistrationCalls (NCCL's in
// <graphsafe/nccl/nccl.hpp>, a recording stand-in in the CPU tests).
#pragma once

#include <graphsafe/virtual_memory.hpp>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace graphsafe::nccl {

// The library's calls for one range (one chunk): register it and give it back.
class RegistrationCalls {
 public:
  virtual ~RegistrationCalls() = default;
  virtual std::string kind() const = 0;  // e.g. "ncclCommWindowRegister"
  // Registers [p, p + bytes); returns the library's handle (may be null). Throws on failure.
  virtual void* register_range(void* p, std::uint64_t bytes) = 0;
  // Gives a handle of register_range back; false when the library reported an error.
  virtual bool deregister(void* handle) noexcept = 0;
};

// What happens to a chunk the arena maps while it captures a graph (capture-time footprints).
enum class CaptureMaps {
  defer,   // registered by flush() or the next mapping made outside a capture
  refuse,  // the mapping fails (capture_state_error): map every chunk the graph needs beforehand
};

struct RegistrarOptions {
  std::uint64_t max_registrations = 4096;  // live registrations (plus deferred chunks) at most
  CaptureMaps capture_maps = CaptureMaps::defer;
};

struct RegistrarStats {
  std::uint64_t registrations = 0;    // register calls made (ever), one per chunk
  std::uint64_t deregistrations = 0;  // ... given back (unmapped chunks, the registrar's end)
  std::uint64_t live = 0;             // chunks registered now
  std::uint64_t pending = 0;          // chunks mapped during a capture and not registered yet
  std::uint64_t deferred = 0;         // chunks ever deferred
  std::uint64_t during_capture = 0;   // register calls made while a capture was mapping: 0 unless misused
  std::uint64_t deregister_failures = 0;
};

class ChunkRegistrar final : public ChunkListener {
 public:
  // `granularity`: the VirtualMemory's chunk size (each chunk is one registration).
  ChunkRegistrar(std::unique_ptr<RegistrationCalls> calls, std::uint64_t granularity, RegistrarOptions options = {});
  // Deregisters what is still registered (detach it from its VirtualMemory first, or let the
  // VirtualMemory, which holds it, go).
  ~ChunkRegistrar() override;
  ChunkRegistrar(const ChunkRegistrar&) = delete;
  ChunkRegistrar& operator=(const ChunkRegistrar&) = delete;

  void mapped(std::uintptr_t va, std::uint64_t count, bool in_capture) override;
  void unmapping(std::uintptr_t va, std::uint64_t count) noexcept override;

  // Registers the deferred chunks, in the order they were mapped (the same on every rank whose
  // captures agree: window registration is collective). Call outside any capture, e.g. right after
  // capture(). Returns how many were registered; throws what a registration throws (the chunks
  // not registered stay deferred).
  std::uint64_t flush();
  // True when every chunk of [p, p + bytes) is registered now.
  bool registered(const void* p, std::uint64_t bytes) const;
  RegistrarStats stats() const;
  const RegistrationCalls& calls() const { return *calls_; }
  // Chunks registered now by every registrar of the process.
  static std::uint64_t process_live();

 private:
  void register_chunks(const std::vector<std::uintptr_t>& chunks);  // under m_; all or nothing

  std::unique_ptr<RegistrationCalls> calls_;
  const std::uint64_t granule_;
  const RegistrarOptions opts_;
  mutable std::mutex m_;
  std::map<std::uintptr_t, void*> handles_;  // registered chunk address -> handle
  std::vector<std::uintptr_t> pending_;      // deferred chunk addresses, in mapping order
  RegistrarStats st_;
};

}  // namespace graphsafe::nccl
