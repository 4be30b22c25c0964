#pragma once
#include <graphsafe/graphsafe.hpp>

// Debug mode for one arena, every option spelled out.
inline graphsafe::ArenaOptions debug_options() {
  graphsafe::ArenaOptions o;
  o.debug = true;                  // default false; GRAPHSAFE_DEBUG=1 turns it on for every arena
  o.canary_bytes = 256;            // guard region behind every workspace
  o.canaries = true;               // fill + check the guards (false: keep the gaps, touch nothing)
  o.canary_check_every = 1;        // check after every replay (0: only on debug::check_canaries)
  o.nvtx = true;                   // NVTX Memory API registration (CUDA backend)
  return o;
}
