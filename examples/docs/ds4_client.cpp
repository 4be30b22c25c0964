// The DS4 client on graphsafe: one gather-path decode layer captured at short lengths and replayed
// after growth, equal to eager bit for bit. Needs a CUDA device (exits 77 = skipped without one).
#include <graphsafe/graphsafe.hpp>
#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/device_problem.hpp>

#include <cstdio>
#include <cstring>
#include <vector>

using namespace graphsafe;
using namespace graphsafe::ds4;

int main() {
  int devices = 0;  // no GPU or no driver: exit 77 (skipped); any other CUDA error fails
  const cudaError_t found = cudaGetDeviceCount(&devices);
  if (found == cudaErrorNoDevice || found == cudaErrorInsufficientDriver || found == cudaErrorStubLibrary) return 77;
  GRAPHSAFE_CUDA(found);
  if (devices == 0) return 77;
  cudaStream_t s;
  GRAPHSAFE_CUDA(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  bool same = false;
  {  // graphs, arena and backend go before the stream they were ordered on
  CudaBackend backend;
  Arena arena(backend);
  arena.reserve(64ull << 20, s);

  LayerConfig cfg;  // a C4 layer, tiny: W = 4, K = 8, max_model_len 512
  cfg.ratio = 4, cfg.window = 4, cfg.topk = 8, cfg.max_model_len = 512, cfg.swa_block_tokens = 16;
  DecodeProblem p = make_problem(cfg, {3, 5}, /*seed=*/7, Picks::random, /*fill_to=*/512);
  cuda::DeviceProblem d = cuda::upload(p);
  const Ds4Symbols syms(cfg);
  GatherDecode layer(arena, cfg, syms, Sizing::safe);  // N: capacity, G: static query bound

  const std::size_t n = std::size_t(2) * cfg.heads * kHeadDim;
  auto out_graph = cuda::device_alloc(n * 2), out_eager = cuda::device_alloc(n * 2);
  auto* og = reinterpret_cast<std::uint16_t*>(out_graph.get());
  auto* oe = reinterpret_cast<std::uint16_t*>(out_eager.get());
  auto graph = capture(arena, s, syms.bind(2, cfg, p.seq_lens),
                       [&](const Bindings& b) { layer.run(s, d, b, og); });

  grow(p, {255, 257}, /*seed=*/7);  // the sequences grew
  cuda::upload_lengths(d, p, s);
  const Bindings b = syms.bind(2, cfg, p.seq_lens);
  graph.replay(b, s);   // guards first (none live: every size was proven replay-safe)
  layer.run(s, d, b, oe);  // eager
  std::vector<std::uint16_t> hg(n), he(n);
  GRAPHSAFE_CUDA(cudaMemcpyAsync(hg.data(), og, n * 2, cudaMemcpyDeviceToHost, s));
  GRAPHSAFE_CUDA(cudaMemcpyAsync(he.data(), oe, n * 2, cudaMemcpyDeviceToHost, s));
  GRAPHSAFE_CUDA(cudaStreamSynchronize(s));
  same = std::memcmp(hg.data(), he.data(), n * 2) == 0;
  std::printf("replay %s eager\n", same ? "==" : "!=");
  }
  GRAPHSAFE_CUDA(cudaStreamDestroy(s));
  return same ? 0 : 1;
}
