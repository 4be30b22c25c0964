// Every environment variable the library reads, read here and nowhere else (docs/concepts.md,
// "Configuration"). Option structs never read the environment in their defaults: an arena or
// backend applies what is set here when it is made. Each call reads the variable afresh.
#pragma once

#include <string>

namespace graphsafe::detail::env {

// GRAPHSAFE_DEBUG set to anything but "", "0", "false", "off" or "no" (any case): debug mode for
// every arena made (ArenaOptions::debug).
bool debug();
// GRAPHSAFE_DEBUG starting with '1': CUDA backends take slabs from cudaMalloc
// (CudaBackendOptions::plain_allocations), so compute-sanitizer sees debug mode's NVTX heaps.
bool plain_allocations();
// GRAPHSAFE_DEBUG_REPORT: where the debug report is written at process exit ("" when unset).
std::string debug_report_path();
// GRAPHSAFE_HOST_EXECUTION: the host backend's execution mode ("synchronous", "seeded",
// "seeded:<seed>"; "" when unset), for HostExecution::environment.
std::string host_execution();

}  // namespace graphsafe::detail::env
