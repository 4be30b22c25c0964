// A program that links graphsafe_cupti: enable() before the first capture, then the findings
// in-process (the JSON report is written at exit as well). Exits 77 without a CUDA device.
#include <graphsafe/cupti.hpp>

#include <cuda_runtime_api.h>

#include <cstdio>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::puts("no CUDA device: nothing to capture");
    return 77;
  }
  if (!graphsafe::cupti::enable()) return 1;  // before the first capture; idempotent; says why on stderr

  cudaStream_t s = nullptr;
  cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  cudaGraph_t graph = nullptr;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
  void* scratch = nullptr;
  cudaMalloc(&scratch, 1 << 20);  // runs once, now: the graph never allocates it again
  cudaStreamEndCapture(s, &graph);
  cudaGraphDestroy(graph);
  cudaFree(scratch);
  cudaStreamDestroy(s);

  // A finding made elsewhere (a host value frozen into a graph) joins the same report.
  graphsafe::cupti::report_external("host-value", "kv.rows", "decode.cpp:42", "row count frozen at capture");
  for (const graphsafe::cupti::Finding& f : graphsafe::cupti::findings())
    std::printf("%s %s %s at %s\n", f.severity.c_str(), f.kind.c_str(), f.api.c_str(), f.site.c_str());
  return graphsafe::cupti::finding_count() == 2 ? 0 : 1;  // the cudaMalloc and the host value
}
