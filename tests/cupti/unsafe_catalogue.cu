// Catalogue of capture-unsafe programs drawn from real bugs, each with a safe twin.
//
//   unsafe_catalogue --case NAME [--safe] [--in-process]     run one case (see --list)
//
// Every case captures a CUDA graph that does one real capture-unsafe thing (or, with --safe, its
// fix). Two detectors report them, into one JSON report (graphsafe_cupti's, $GRAPHSAFE_CUPTI_REPORT):
//   * raw CUDA calls during capture (allocations, frees, host syncs, D2H copies, one exec on two
//     streams) are caught by graphsafe_cupti's CUPTI callbacks -- loaded through
//     CUDA_INJECTION64_PATH, or turned on here with --in-process (graphsafe::cupti::enable());
//   * host values frozen into the graph (sizes, strides, plans) are invisible to CUPTI: graphsafe's
//     own capture findings (Plan::findings()) and replay guards (guard_failure) catch them; this
//     program forwards them to the report with graphsafe::cupti::report_external.
// check_case.cmake runs each case and checks the report: unsafe -> flagged with the right kind and
// site; safe -> zero findings. The case functions are never inlined so each is a frame of its own;
// graphsafe_cupti names them from the executable's symbol table and debug info. The catalogue is
// built twice: with the shared CUDA runtime (unsafe_catalogue) and with the static one, nvcc's
// default, exporting no symbols (unsafe_catalogue_static).
#include <graphsafe/cuda_mr.hpp>  // first: defines the CCCL experimental memory-resource macro

#include <graphsafe/cupti.hpp>
#include <graphsafe/graphsafe.hpp>

#include "../support/cuda_device.hpp"

#include <cub/device/device_radix_sort.cuh>
#include <thrust/execution_policy.h>
#include <thrust/sort.h>

#include <cuda_runtime_api.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

using namespace graphsafe;

#define NOINLINE __attribute__((noinline))

// ---- helpers ------------------------------------------------------------------------------------

// CUDA errors are expected in some unsafe cases (the capture may be invalidated): report, go on.
static bool soft(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return true;
  std::fprintf(stderr, "unsafe_catalogue: %s -> %s (%s) [expected in some unsafe cases]\n", what, cudaGetErrorName(e),
               cudaGetErrorString(e));
  cudaGetLastError();
  return false;
}
#define SOFT(call) soft((call), #call)
// Setup that must work.
#define HARD(call)                                                                       \
  do {                                                                                   \
    cudaError_t e_ = (call);                                                             \
    if (e_ != cudaSuccess) {                                                             \
      std::fprintf(stderr, "unsafe_catalogue: %s failed: %s\n", #call, cudaGetErrorString(e_)); \
      std::exit(2);                                                                      \
    }                                                                                    \
  } while (0)

__global__ void fill_kernel(int* p, std::int64_t n, int v) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    p[i] = v;
}
__global__ void read_count_kernel(const int* count, int* out) {  // the device-side fix: read the value here
  for (int i = threadIdx.x; i < *count; i += blockDim.x) out[i] = i;
}
__global__ void spin_kernel(long long cycles, int* out) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
  if (threadIdx.x == 0) out[0] += 1;
}

static void fill(cudaStream_t s, void* p, std::int64_t n, int v = 7) {
  if (n <= 0 || !p) return;
  fill_kernel<<<static_cast<int>(std::min<std::int64_t>((n + 255) / 256, 256)), 256, 0, s>>>(static_cast<int*>(p), n, v);
}

struct Ctx {
  cudaStream_t s = nullptr, side = nullptr;
  int* d_buf = nullptr;    // 1 Mi ints of scratch, allocated before any capture
  int* d_count = nullptr;  // a count the device computed
  Ctx() {
    HARD(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    HARD(cudaStreamCreateWithFlags(&side, cudaStreamNonBlocking));
    HARD(cudaMalloc(&d_buf, (1 << 20) * sizeof(int)));
    HARD(cudaMalloc(&d_count, sizeof(int)));
    const int c = 100;
    HARD(cudaMemcpy(d_count, &c, sizeof c, cudaMemcpyHostToDevice));
    // Warm up every kernel eagerly so module loading never happens inside a capture.
    fill(s, d_buf, 1 << 20, 0);
    read_count_kernel<<<1, 128, 0, s>>>(d_count, d_buf);
    spin_kernel<<<1, 1, 0, s>>>(10, d_buf);
    HARD(cudaStreamSynchronize(s));
  }
  ~Ctx() {
    cudaDeviceSynchronize();
    cudaFree(d_buf);
    cudaFree(d_count);
    cudaStreamDestroy(s);
    cudaStreamDestroy(side);
  }
};

// A raw capture (the pattern of the code the bugs come from), tolerant of invalidation.
template <class Fn>
static void raw_capture_and_replay(cudaStream_t s, cudaStreamCaptureMode mode, Fn&& body, int replays = 2) {
  HARD(cudaStreamBeginCapture(s, mode));
  body();
  cudaGraph_t g = nullptr;
  if (!SOFT(cudaStreamEndCapture(s, &g)) || !g) return;
  cudaGraphExec_t e = nullptr;
  if (SOFT(cudaGraphInstantiate(&e, g, 0))) {
    for (int i = 0; i < replays; ++i) SOFT(cudaGraphLaunch(e, s));
    SOFT(cudaStreamSynchronize(s));
    cudaGraphExecDestroy(e);
  }
  cudaGraphDestroy(g);
}

static void report_plan(const Plan& p) {
  for (const auto& f : p.findings()) cupti::report_external("host-value", f.request, f.site, f.message);
}

// Capture `body` through graphsafe at `cap`, report its findings, then replay at `grown` (guards first).
static void graphsafe_case(Ctx& c, const Bindings& cap, const Bindings& grown,
                           const std::function<void(Arena&, cudaStream_t, const Bindings&)>& body) {
  CudaBackend backend;
  Arena arena(backend);
  arena.reserve(64ull << 20, c.s);
  HARD(cudaStreamSynchronize(c.s));
  {
    auto g = capture(arena, c.s, cap, [&](const Bindings& b) { body(arena, c.s, b); });
    report_plan(g.plan());
    try {
      g.replay(cap, c.s);
      g.replay(grown, c.s);
    } catch (const guard_failure& e) {
      for (const auto& v : e.violations())
        cupti::report_external("guard-failure", v.request, v.site,
                               "replay refused before launch: needs " + std::to_string(v.required) + ", reserved " +
                                   std::to_string(v.reserved) + " (" + v.symbols + ")");
    }
    HARD(cudaStreamSynchronize(c.s));
  }
}

// ---- CUPTI-visible cases ------------------------------------------------------------------------

// A metadata buffer cudaMalloc'ed inside a relaxed-mode capture (PyTorch-style code that captures
// with capture_error_mode="relaxed"): it succeeds silently and is not part of the graph.
NOINLINE void gs_case_relaxed_malloc(Ctx& c, bool safe) {
  int* meta = nullptr;
  if (safe) HARD(cudaMalloc(&meta, 4096 * sizeof(int)));  // fix: allocate before the capture
  raw_capture_and_replay(c.s, cudaStreamCaptureModeRelaxed, [&] {
    if (!safe) SOFT(cudaMalloc(&meta, 4096 * sizeof(int)));
    fill(c.s, meta, 4096);
  });
  cudaFree(meta);
}

// A split-K workspace from cudaMallocAsync inside the capture, sized from a host value: a graph
// memory node outside the arena, frozen at its capture-time size.
NOINLINE void gs_case_malloc_async_outside_arena(Ctx& c, bool safe) {
  const std::int64_t splits_now = 3;  // host value at capture
  if (!safe) {
    raw_capture_and_replay(c.s, cudaStreamCaptureModeGlobal, [&] {
      void* ws = nullptr;
      SOFT(cudaMallocAsync(&ws, splits_now * 4096 * sizeof(int), c.s));
      fill(c.s, ws, splits_now * 4096);
      SOFT(cudaFreeAsync(ws, c.s));
    });
    return;
  }
  // Fix: the workspace from the arena, sized by the capacity of the split count.
  Symbol splits = Symbol::dynamic("splitk.splits", 16);
  Bindings cap, grown;
  cap.set(splits, splits_now);
  grown.set(splits, 12);
  graphsafe_case(c, cap, grown, [&](Arena& a, cudaStream_t s, const Bindings& b) {
    auto ws = a.request(s, "splitk.workspace", Extent(splits) * 4096, sizeof(int), capacity_bound, b);
    fill(s, ws.data(), ws.count());
  });
}

// The host waits for a copy stream in the middle of a capture to read a value.
NOINLINE void gs_case_stream_sync_relaxed(Ctx& c, bool safe) {
  raw_capture_and_replay(c.s, cudaStreamCaptureModeRelaxed, [&] {
    if (!safe) SOFT(cudaStreamSynchronize(c.side));
    read_count_kernel<<<1, 128, 0, c.s>>>(c.d_count, c.d_buf);
  });
}

// The .item() pattern: a synchronous D2H copy of a device count inside a relaxed capture, the launch
// sized from it (frozen at the stale capture-time value).
NOINLINE void gs_case_d2h_memcpy_relaxed(Ctx& c, bool safe) {
  raw_capture_and_replay(c.s, cudaStreamCaptureModeRelaxed, [&] {
    if (!safe) {
      int h = 0;
      SOFT(cudaMemcpy(&h, c.d_count, sizeof h, cudaMemcpyDeviceToHost));
      fill(c.s, c.d_buf, std::max(h, 1));
    } else {
      read_count_kernel<<<1, 128, 0, c.s>>>(c.d_count, c.d_buf);  // fix: the kernel reads the count
    }
  });
}

// Two synchronous D2H copies inside a relaxed capture, made by two functions: two findings, one
// per call site. (With a statically linked runtime both calls' innermost frames are the runtime's
// own code inside the executable; taken for the site, they merged the two into one finding.)
NOINLINE int gs_read_token_count(Ctx& c) {
  int h = 0;
  SOFT(cudaMemcpy(&h, c.d_count, sizeof h, cudaMemcpyDeviceToHost));
  return h;
}
NOINLINE int gs_read_block_count(Ctx& c) {
  int h = 0;
  SOFT(cudaMemcpy(&h, c.d_count, sizeof h, cudaMemcpyDeviceToHost));
  return h;
}
NOINLINE void gs_case_two_d2h_callers(Ctx& c, bool safe) {
  raw_capture_and_replay(c.s, cudaStreamCaptureModeRelaxed, [&] {
    if (!safe) {
      const int tokens = gs_read_token_count(c);
      const int blocks = gs_read_block_count(c);
      fill(c.s, c.d_buf, std::max(tokens + blocks, 1));
    } else {
      read_count_kernel<<<1, 128, 0, c.s>>>(c.d_count, c.d_buf);  // fix: the kernel reads the count
    }
  });
}

// Thrust temporaries without the graphsafe allocator: thrust's default cudaMalloc/cudaFree of the
// sort's temporary storage inside the capture (the graph keeps a freed address).
NOINLINE void gs_case_thrust_temporaries(Ctx& c, bool safe) {
  const int n = 1 << 16;
  fill(c.s, c.d_buf, n, 3);
  HARD(cudaStreamSynchronize(c.s));
  if (!safe) {
    raw_capture_and_replay(c.s, cudaStreamCaptureModeRelaxed, [&] {
      try {
        thrust::sort(thrust::cuda::par_nosync.on(c.s), c.d_buf, c.d_buf + n);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "unsafe_catalogue: thrust threw: %s\n", e.what());
      }
    }, 1);
    return;
  }
  CudaBackend backend;
  Arena arena(backend);
  arena.reserve(64ull << 20, c.s);
  HARD(cudaStreamSynchronize(c.s));
  thrust_allocator alloc(arena, c.s);
  auto g = capture(arena, c.s, Bindings{}, [&](const Bindings&) {
    thrust::sort(thrust::cuda::par_nosync(alloc).on(c.s), c.d_buf, c.d_buf + n);
  });
  report_plan(g.plan());
  g.replay(Bindings{}, c.s);
  HARD(cudaStreamSynchronize(c.s));
}

// CUB's two-phase call with the temporary storage cudaMalloc'ed between the phases, inside capture.
NOINLINE void gs_case_cub_two_phase(Ctx& c, bool safe) {
  const int n = 1 << 16;
  int* out = c.d_buf + n;
  std::size_t temp_bytes = 0;
  HARD(cub::DeviceRadixSort::SortKeys(nullptr, temp_bytes, c.d_buf, out, n, 0, 32, c.s));
  if (!safe) {
    void* temp = nullptr;
    raw_capture_and_replay(c.s, cudaStreamCaptureModeRelaxed, [&] {
      SOFT(cudaMalloc(&temp, temp_bytes));
      if (temp) SOFT(cub::DeviceRadixSort::SortKeys(temp, temp_bytes, c.d_buf, out, n, 0, 32, c.s));
    });
    cudaFree(temp);
    return;
  }
  CudaBackend backend;
  Arena arena(backend);
  arena.reserve(64ull << 20, c.s);
  HARD(cudaStreamSynchronize(c.s));
  ArenaResource res(arena, c.s);
  auto g = capture(arena, c.s, Bindings{}, [&](const Bindings&) {
    void* temp = res.allocate_async(temp_bytes, 256, res.stream_ref());
    HARD(cub::DeviceRadixSort::SortKeys(temp, temp_bytes, c.d_buf, out, n, 0, 32, c.s));
    res.deallocate_async(temp, temp_bytes, 256, res.stream_ref());
  });
  report_plan(g.plan());
  g.replay(Bindings{}, c.s);
  HARD(cudaStreamSynchronize(c.s));
}

// One graph exec launched on a second stream while its launch on the first may still run.
NOINLINE void gs_case_two_stream_launch(Ctx& c, bool safe) {
  cudaGraph_t g = nullptr;
  HARD(cudaStreamBeginCapture(c.s, cudaStreamCaptureModeGlobal));
  spin_kernel<<<1, 1, 0, c.s>>>(20'000'000, c.d_buf);  // ~10 ms
  HARD(cudaStreamEndCapture(c.s, &g));
  cudaGraphExec_t e = nullptr;
  HARD(cudaGraphInstantiate(&e, g, 0));
  HARD(cudaGraphLaunch(e, c.s));
  if (safe) {  // fix: order the second stream after the first launch
    cudaEvent_t ev = nullptr;
    HARD(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    HARD(cudaEventRecord(ev, c.s));
    HARD(cudaStreamWaitEvent(c.side, ev, 0));
    cudaEventDestroy(ev);
  }
  HARD(cudaGraphLaunch(e, c.side));
  HARD(cudaDeviceSynchronize());
  cudaGraphExecDestroy(e);
  cudaGraphDestroy(g);
}

// sglang#27664: per-step metadata objects re-allocated (here: stream-ordered) by the metadata
// builder; the graph keeps the buffer of the capture step, later steps write fresh ones.
NOINLINE void* prepare_metadata_sglang(Ctx& c, void* persistent, std::int64_t n) {
  void* meta = persistent;
  if (!persistent) SOFT(cudaMallocAsync(&meta, n * sizeof(int), c.s));  // bug: a new buffer every step
  return meta;
}
NOINLINE void gs_case_sglang27664_metadata_realloc(Ctx& c, bool safe) {
  const std::int64_t n = 4096;
  void* persistent = nullptr;
  if (safe) HARD(cudaMalloc(&persistent, n * sizeof(int)));  // fix: persistent buffer, copied into
  raw_capture_and_replay(c.s, cudaStreamCaptureModeGlobal, [&] {
    void* meta = prepare_metadata_sglang(c, persistent, n);
    fill(c.s, meta, n);
  }, 1);
  cudaFree(persistent);
}

// ---- host-value cases: graphsafe's own detection ------------------------------------------------

// vllm#51318: C128A metadata row stride = batch-dependent packed width (max ceil(L/128)), frozen at
// capture; longer sequences move rows under the captured consumers. Fix: capacity stride.
NOINLINE void gs_case_vllm51318_c128_row_stride(Ctx& c, bool safe) {
  Symbol R = Symbol::fixed("requests");
  Symbol L = Symbol::batch("seq_lens", R, 8192);
  Bindings cap, grown;
  cap.set(R, 2).set(L, {100, 200});
  grown.set(R, 2).set(L, {100, 5000});
  graphsafe_case(c, cap, grown, [&](Arena& a, cudaStream_t s, const Bindings& b) {
    const Extent width = max_over(L, [](const Extent& l) { return ceil_div(l, 128); });
    const std::int64_t stride = a.dimension(s, "c128a.row_stride", width, safe ? static_cast<const SizingPolicy&>(capacity_bound) : exact_at_capture, b);
    auto ws = a.request(s, "c128a.metadata", Extent(R) * stride, sizeof(int), capacity_bound, b);
    fill(s, ws.data(), ws.count());
  });
}

// vllm#51970: capture with all-zero indexer seq_lens sizes the paged-MQA metadata to nothing.
NOINLINE void gs_case_vllm51970_zero_seq_lens(Ctx& c, bool safe) {
  Symbol R = Symbol::fixed("requests");
  Symbol L = Symbol::batch("indexer_seq_lens", R, 8192);
  Bindings cap, grown;
  cap.set(R, 2).set(L, {0, 0});
  grown.set(R, 2).set(L, {300, 500});
  graphsafe_case(c, cap, grown, [&](Arena& a, cudaStream_t s, const Bindings& b) {
    const Extent need = sum_over(L, [](const Extent& l) { return ceil_div(l, 64); }) * 4;
    auto ws = a.request(s, "indexer.metadata", need, sizeof(int), safe ? static_cast<const SizingPolicy&>(capacity_bound) : exact_at_capture, b);
    fill(s, ws.data(), ws.count());
  });
}

// TensorRT-LLM#15940: DS4 MTP buffers sized to the exact captured token count (padding disabled);
// a replay with more real tokens than the captured bucket overruns them.
NOINLINE void gs_case_trtllm15940_exact_size_replay(Ctx& c, bool safe) {
  Symbol T = Symbol::dynamic("num_tokens", 256);
  Symbol K = Symbol::fixed("mtp_depth");
  Bindings cap, grown;
  cap.set(T, 8).set(K, 3);
  grown.set(T, 12).set(K, 3);
  graphsafe_case(c, cap, grown, [&](Arena& a, cudaStream_t s, const Bindings& b) {
    auto ws = a.request(s, "mtp.draft_tokens", Extent(T) * (Extent(K) + 1), sizeof(int), safe ? static_cast<const SizingPolicy&>(capacity_bound) : exact_at_capture, b);
    fill(s, ws.data(), ws.count());
  });
}

// tokenspeed#613: sliding-window capture sized to window-1 instead of the full window.
NOINLINE void gs_case_tokenspeed613_window_minus_1(Ctx& c, bool safe) {
  Symbol R = Symbol::fixed("requests");
  Symbol W = Symbol::fixed("window");
  Symbol Wm1 = Symbol::fixed("window_minus_1");
  Symbol L = Symbol::batch("seq_lens", R, 8192);
  Bindings cap, grown;
  cap.set(R, 2).set(W, 128).set(Wm1, 127).set(L, {50, 60});
  grown.set(R, 2).set(W, 128).set(Wm1, 127).set(L, {300, 400});
  graphsafe_case(c, cap, grown, [&](Arena& a, cudaStream_t s, const Bindings& b) {
    const Extent need = Extent(R) * max_over(L, [&](const Extent& l) { return min(l, Extent(W)); });
    const StaticQueryBound pol = static_query_bound(Extent(R) * (safe ? W : Wm1));
    auto ws = a.request(s, "swa.slots", need, sizeof(int), pol, b);
    fill(s, ws.data(), ws.count());
  });
}

// ROCm/ATOM#1591: buffers sized with the model's index_topk (512) while the kernel selects a
// hard-coded 1024: mis-sized once the compressed length passes 512 (~2K tokens at C4).
NOINLINE void gs_case_atom1591_hardcoded_topk(Ctx& c, bool safe) {
  Symbol R = Symbol::fixed("requests");
  Symbol model_topk = Symbol::fixed("model_index_topk");
  Symbol L = Symbol::batch("seq_lens", R, 16384);
  Bindings cap, grown;
  cap.set(R, 2).set(model_topk, 512).set(L, {400, 800});
  grown.set(R, 2).set(model_topk, 512).set(L, {3000, 4000});
  graphsafe_case(c, cap, grown, [&](Arena& a, cudaStream_t s, const Bindings& b) {
    constexpr std::int64_t kKernelTopk = 1024;  // what the kernel selects
    const Extent need = Extent(R) * max_over(L, [](const Extent& l) { return min(floor_div(l, 4), Extent(kKernelTopk)); });
    const StaticQueryBound pol = static_query_bound(safe ? Extent(R) * kKernelTopk : Extent(R) * model_topk);
    auto ws = a.request(s, "indexer.topk_indices", need, sizeof(int), pol, b);
    fill(s, ws.data(), ws.count());
  });
}

// flashinfer#3904: the plan (KV chunk count) computed at capture and not re-run before replay.
NOINLINE void gs_case_flashinfer3904_plan_not_rerun(Ctx& c, bool safe) {
  Symbol R = Symbol::fixed("requests");
  Symbol L = Symbol::batch("kv_lens", R, 8192);
  Bindings cap, grown;
  cap.set(R, 2).set(L, {300, 700});
  grown.set(R, 2).set(L, {300, 6000});
  graphsafe_case(c, cap, grown, [&](Arena& a, cudaStream_t s, const Bindings& b) {
    const Extent chunks_need = max_over(L, [](const Extent& l) { return ceil_div(l, 256); });
    const std::int64_t chunks = a.dimension(s, "plan.kv_chunks", chunks_need, safe ? static_cast<const SizingPolicy&>(capacity_bound) : exact_at_capture, b);
    auto ws = a.request(s, "plan.partial_out", Extent(R) * chunks * 512, sizeof(int), capacity_bound, b);
    fill(s, ws.data(), ws.count());
  });
}

// The seed (DS4 sparse decode, non-BI): compressed rows N and SWA offset from CPU sequence lengths
// at capture; longer sequences overlap the SWA region or run past the workspace.
NOINLINE void gs_case_seed_gather_workspace(Ctx& c, bool safe) {
  Symbol R = Symbol::fixed("requests");
  Symbol W = Symbol::fixed("window");
  Symbol L = Symbol::batch("seq_lens", R, 512);
  Bindings cap, grown;
  cap.set(R, 2).set(W, 4).set(L, {3, 5});
  grown.set(R, 2).set(W, 4).set(L, {15, 17});
  graphsafe_case(c, cap, grown, [&](Arena& a, cudaStream_t s, const Bindings& b) {
    const Extent n_c = max_over(L, [](const Extent& l) { return floor_div(l, 4); });
    const Extent g = max_over(L, [&](const Extent& l) { return min(l, Extent(W)); });
    const StaticQueryBound swa = static_query_bound(Extent(W));
    const std::int64_t N = a.dimension(s, "kv.compressed_rows", n_c, safe ? static_cast<const SizingPolicy&>(capacity_bound) : exact_at_capture, b);
    const std::int64_t G = a.dimension(s, "kv.swa_rows", g, safe ? static_cast<const SizingPolicy&>(swa) : exact_at_capture, b);
    auto ws = a.request(s, "kv", Extent(R) * (N + G) * 512, sizeof(int), capacity_bound, b);
    fill(s, ws.data(), ws.count());
  });
}

// ---- driver -------------------------------------------------------------------------------------

struct Case {
  const char* name;
  void (*fn)(Ctx&, bool);
  const char* source;
};

static const Case kCases[] = {
    {"relaxed_malloc", gs_case_relaxed_malloc, "cudaMalloc inside a relaxed-mode capture (vllm-ascend#15486 / PyTorch capture_error_mode=relaxed)"},
    {"malloc_async_outside_arena", gs_case_malloc_async_outside_arena, "cudaMallocAsync workspace inside capture, host-sized (graph memory node outside the arena)"},
    {"stream_sync_relaxed", gs_case_stream_sync_relaxed, "cudaStreamSynchronize inside a relaxed capture"},
    {"d2h_memcpy_relaxed", gs_case_d2h_memcpy_relaxed, "cudaMemcpy D2H inside a relaxed capture (.item() pattern)"},
    {"two_d2h_callers", gs_case_two_d2h_callers, "two cudaMemcpy D2H calls inside a relaxed capture, from two functions"},
    {"thrust_temporaries", gs_case_thrust_temporaries, "Thrust sort temporaries without the graphsafe allocator"},
    {"cub_two_phase", gs_case_cub_two_phase, "CUB two-phase temp storage cudaMalloc'ed inside capture"},
    {"two_stream_launch", gs_case_two_stream_launch, "one graph exec launched on two streams without ordering"},
    {"sglang27664_metadata_realloc", gs_case_sglang27664_metadata_realloc, "sgl-project/sglang#27664 metadata re-allocated per step"},
    {"vllm51318_c128_row_stride", gs_case_vllm51318_c128_row_stride, "vllm-project/vllm#51318 batch-dependent C128A row stride"},
    {"vllm51970_zero_seq_lens", gs_case_vllm51970_zero_seq_lens, "vllm-project/vllm#51970 all-zero seq_lens metadata at capture"},
    {"trtllm15940_exact_size_replay", gs_case_trtllm15940_exact_size_replay, "NVIDIA/TensorRT-LLM#15940 exact-size replay buffers"},
    {"tokenspeed613_window_minus_1", gs_case_tokenspeed613_window_minus_1, "lightseekorg/tokenspeed#613 window-1 SWA sizing"},
    {"atom1591_hardcoded_topk", gs_case_atom1591_hardcoded_topk, "ROCm/ATOM#1591 hard-coded index_topk vs the model's"},
    {"flashinfer3904_plan_not_rerun", gs_case_flashinfer3904_plan_not_rerun, "flashinfer-ai/flashinfer#3904 plan not re-run before replay"},
    {"seed_gather_workspace", gs_case_seed_gather_workspace, "the seed: DS4 sparse-decode gather workspace sized from CPU lengths"},
};

int main(int argc, char** argv) {
  std::string name;
  bool safe = false, in_process = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--case" && i + 1 < argc) name = argv[++i];
    else if (a == "--safe") safe = true;
    else if (a == "--in-process") in_process = true;
    else if (a == "--list") {
      for (const auto& c : kCases) std::printf("%-32s %s\n", c.name, c.source);
      return 0;
    } else {
      std::fprintf(stderr, "usage: %s --case NAME [--safe] [--in-process] | --list\n", argv[0]);
      return 2;
    }
  }
  const Case* chosen = nullptr;
  for (const auto& c : kCases)
    if (name == c.name) chosen = &c;
  if (!chosen) {
    std::fprintf(stderr, "unknown case '%s' (--list)\n", name.c_str());
    return 2;
  }
  if (const int rc = graphsafe::testing::gpu_test_skip_or_fail("unsafe_catalogue"); rc >= 0) return rc;
  if (in_process && !cupti::enable()) return 3;
  std::fprintf(stderr, "unsafe_catalogue: case %s (%s): %s\n", chosen->name, safe ? "safe twin" : "unsafe",
               chosen->source);
  {
    Ctx ctx;
    try {
      chosen->fn(ctx, safe);
    } catch (const std::exception& e) {
      // graphsafe errors (policy refusals, capture errors) are findings too.
      cupti::report_external("exception", chosen->name, chosen->name, e.what());
    }
  }
  return 0;
}
