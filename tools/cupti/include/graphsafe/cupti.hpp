// graphsafe_cupti: catch capture-unsafe CUDA calls made by any code in the process.
//
// Two ways to turn it on:
//   * unmodified programs (no rebuild): the CUDA driver loads the library through its injection
//     mechanism, as profilers do:
//         CUDA_INJECTION64_PATH=/path/libgraphsafe_cupti.so ./my_program      (or python3 script.py)
//   * programs that link graphsafe_cupti: call graphsafe::cupti::enable() before the first capture.
//
// While any stream is capturing (tracked through cudaStreamBeginCapture / cuStreamBeginCapture{,_v2},
// cudaStreamBeginCaptureToGraph and the matching EndCapture calls, every mode: global, thread-local,
// relaxed), it reports every raw allocation or free (cudaMalloc*, cudaFree*, cudaMallocAsync /
// cudaMallocFromPoolAsync / cudaFreeAsync, cuMemAlloc*, cuMemCreate, ...), host synchronization
// (cudaDeviceSynchronize, cudaStreamSynchronize, cudaEventSynchronize, cudaStreamQuery on a
// capturing stream, driver equivalents) and device-to-host copy (cudaMemcpy* with a D2H kind,
// cuMemcpyDtoH*), with the API, the capture's stream, mode and id, the calling thread and a
// symbolized backtrace. It also reports one graph exec launched on two streams with no ordering
// (host sync or event wait) between the launches. Findings are printed on stderr when the capture
// ends and written as JSON at exit to $GRAPHSAFE_CUPTI_REPORT, else $GRAPHSAFE_DEBUG_REPORT, else
// ./graphsafe_cupti_report.json.
//
// Calls made while the calling thread has switched its own capture interaction mode to relaxed
// (cudaThreadExchangeStreamCaptureMode, as PyTorch's caching allocator does to grow a graph's private
// pool) are deliberate: they are kept as "note"s, not findings.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace graphsafe::cupti {

struct Finding {
  std::string severity;        // "error", "warning" (another thread than the capture's, non-global mode), "note"
  std::string kind;            // alloc, free, alloc-async, free-async, host-sync, d2h-copy, graph-launch-concurrent,
                               // or an external kind (host-value, guard-failure, ...) from report_external
  std::string api;             // "cudaMalloc", "cuMemAlloc_v2", ... (or the request name for external findings)
  std::string reason;          // one sentence: what is unsafe and what to do
  std::string site;            // first frame outside CUDA/CUPTI: "function (module+0xoff)" or file:line
  std::vector<std::string> backtrace;
  std::uint64_t bytes = 0;     // allocation size when known
  std::uintptr_t stream = 0;   // stream argument of the call (0: none / legacy)
  bool on_capturing_stream = false;
  std::uint64_t capture_id = 0;      // the capture it was made during (0: none known)
  std::uintptr_t capture_stream = 0;
  std::string capture_mode;          // global, thread_local, relaxed
  long thread = 0;                   // Linux tid of the calling thread
  long capture_thread = 0;           // tid that began the capture
  std::uint64_t count = 1;           // identical findings (same API, site, capture) are merged
};

// Subscribe to runtime + driver API callbacks. Idempotent. Returns false (and says why on stderr)
// when CUPTI cannot be used (no driver, another CUPTI subscriber such as a profiler).
bool enable();
// Unsubscribe (findings are kept).
void disable();
bool enabled();

// Findings so far (errors and warnings; notes too when asked).
std::vector<Finding> findings(bool include_notes = false);
std::size_t finding_count();
void clear();

// Write the JSON report now (also done at exit). Empty path: the environment / default path.
bool write_report(const std::string& path = {});
std::string report_path();

// Add a finding detected elsewhere (graphsafe's own capture findings: host values frozen into a
// graph, guard failures on replay) so that one report holds everything.
void report_external(const std::string& kind, const std::string& what, const std::string& site,
                     const std::string& reason, const std::string& severity = "error");

}  // namespace graphsafe::cupti

extern "C" {
// Entry point the CUDA driver calls when the library is named by CUDA_INJECTION64_PATH.
int InitializeInjection(void);
// C ABI for dlsym users (e.g. ctypes): enable, count of findings, write the report.
int graphsafe_cupti_enable(void);
unsigned long long graphsafe_cupti_finding_count(void);
int graphsafe_cupti_write_report(const char* path);
}
