// CCCL memory resource and Thrust/CUB allocator over a graphsafe Arena.
//
//   graphsafe::ArenaResource res(arena, stream);                 // a cuda::mr async resource
//   cuda::mr::async_resource_ref<cuda::mr::device_accessible> ref{res};
//   void* tmp = ref.allocate_async(bytes, 256, cuda::stream_ref{stream});
//
//   graphsafe::thrust_allocator alloc(arena, stream);
//   thrust::sort(thrust::cuda::par_nosync(alloc).on(stream), first, last);
//
// Both forward to Arena::allocate / Arena::deallocate (opaque byte requests): outside capture the
// bytes come from the arena's free list, stream-ordered; while the stream is capturing through
// graphsafe (capture() / CaptureSession) they are recorded in the capture's plan and placed in the
// family's region, so library temporaries (CUB temp storage, Thrust buffers) made inside a capture
// keep their addresses for every replay. A deallocate inside the capture gives the range to the
// capture's later requests on that stream (or on streams joined after it); the graph keeps the
// range reserved.
//
// Requires CCCL's experimental memory resource concepts (CUDA 12.x/13.x `<cuda/memory_resource>`);
// this header defines LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE unless the build already did.
// Include it before any other CCCL header in a translation unit, or define the macro globally.
#pragma once

#ifndef LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#define LIBCUDACXX_ENABLE_EXPERIMENTAL_MEMORY_RESOURCE
#endif

#include <graphsafe/arena.hpp>
#include <graphsafe/stream.hpp>

#include <cuda/memory_resource>
#include <cuda/stream_ref>

#include <cstddef>
#include <cstdint>

namespace graphsafe {

// A first-class cuda::mr resource over an Arena, bound to a stream.
//
// allocate()/deallocate() are the synchronous-looking entry points of the resource concept; they are
// stream-ordered on the bound stream (as allocate_async(bytes, align, bound stream)): the memory is
// ready for work on that stream, and for other streams after they order themselves after it.
// allocate_async()/deallocate_async() use the stream given. Alignments up to 256 bytes (what
// cudaMalloc gives) are served; larger ones throw invalid_argument_error.
//
// Two resources compare equal when they share an arena: either can release what the other served.
//
// The device_accessible property is declared unconditionally: the arena serves device memory on the
// CUDA backend. (Over the HostBackend, used in CPU tests, the memory is host memory.)
class ArenaResource {
 public:
  ArenaResource(Arena& arena, Stream s) noexcept : arena_(&arena), stream_(s) {}

  void* allocate(std::size_t bytes, std::size_t alignment = cuda::mr::default_cuda_malloc_alignment) {
    return arena_->allocate(stream_, bytes, alignment);
  }
  // Not noexcept: a pointer this arena did not serve throws invalid_argument_error (through a
  // cuda::mr resource_ref that terminates, as a double free should).
  void deallocate(void* p, std::size_t bytes, std::size_t alignment = cuda::mr::default_cuda_malloc_alignment) {
    (void)alignment;
    arena_->deallocate(stream_, p, bytes);
  }

  void* allocate_async(std::size_t bytes, std::size_t alignment, cuda::stream_ref s) {
    return arena_->allocate(Stream(s.get()), bytes, alignment);
  }
  void* allocate_async(std::size_t bytes, cuda::stream_ref s) {
    return allocate_async(bytes, cuda::mr::default_cuda_malloc_alignment, s);
  }
  void deallocate_async(void* p, std::size_t bytes, std::size_t alignment, cuda::stream_ref s) {
    (void)alignment;
    arena_->deallocate(Stream(s.get()), p, bytes);
  }
  void deallocate_async(void* p, std::size_t bytes, cuda::stream_ref s) {
    deallocate_async(p, bytes, cuda::mr::default_cuda_malloc_alignment, s);
  }

  friend bool operator==(const ArenaResource& a, const ArenaResource& b) noexcept {
    return a.arena_ == b.arena_;  // an arena is neither copied nor moved: one object, one pool
  }
  friend bool operator!=(const ArenaResource& a, const ArenaResource& b) noexcept { return !(a == b); }

  friend void get_property(const ArenaResource&, cuda::mr::device_accessible) noexcept {}

  Arena& arena() const noexcept { return *arena_; }
  Stream stream() const noexcept { return stream_; }
  // The stream as CCCL spells it (for the async entry points).
  cuda::stream_ref stream_ref() const noexcept { return cuda::stream_ref(stream_.cuda()); }

 private:
  Arena* arena_;
  Stream stream_;
};

static_assert(cuda::mr::resource<ArenaResource>);
static_assert(cuda::mr::async_resource<ArenaResource>);
static_assert(cuda::mr::async_resource_with<ArenaResource, cuda::mr::device_accessible>);
static_assert(cuda::mr::resource_with<ArenaResource, cuda::mr::device_accessible>);

// Byte allocator for Thrust (`thrust::cuda::par_nosync(alloc).on(stream)`, `par(alloc)`) and any
// code that wants a std-style allocator of raw bytes. Allocations go through the arena on the bound
// stream; pass the same stream to `.on(stream)`.
class thrust_allocator {
 public:
  using value_type = char;
  using size_type = std::size_t;
  using difference_type = std::ptrdiff_t;

  thrust_allocator(Arena& arena, Stream s) noexcept : arena_(&arena), stream_(s) {}

  char* allocate(std::size_t n) { return static_cast<char*>(arena_->allocate(stream_, n)); }
  void deallocate(char* p, std::size_t n) { arena_->deallocate(stream_, p, n); }

  friend bool operator==(const thrust_allocator& a, const thrust_allocator& b) noexcept {
    return a.arena_ == b.arena_;  // an arena is neither copied nor moved: one object, one pool
  }
  friend bool operator!=(const thrust_allocator& a, const thrust_allocator& b) noexcept { return !(a == b); }

  Arena& arena() const noexcept { return *arena_; }
  Stream stream() const noexcept { return stream_; }

 private:
  Arena* arena_;
  Stream stream_;
};

}  // namespace graphsafe
