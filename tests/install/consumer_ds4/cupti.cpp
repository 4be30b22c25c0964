// Link check of the installed CUPTI tool: its header and graphsafe::cupti (not run: CUPTI needs a
// driver).
#include <graphsafe/cupti.hpp>

#include <cstdio>

int main() {
  std::printf("graphsafe_cupti findings: %zu\n", graphsafe::cupti::finding_count());
  return 0;
}
