// Consumer of the installed graphsafe::ds4: the client's layer widths, symbols, sizing policies and
// the attention kernel's host-side launch checks, compared with values worked out by hand. Needs no
// GPU (it launches nothing), but links the client with its kernels and the CUDA runtime.
#include <graphsafe/ds4/decode_step.hpp>
#include <graphsafe/ds4/kernels.hpp>
#include <graphsafe/graphsafe.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

using namespace graphsafe;
using namespace graphsafe::ds4;

namespace {
int failures = 0;
void expect(bool ok, const std::string& what) {
  if (!ok) {
    std::printf("FAIL: %s\n", what.c_str());
    ++failures;
  }
}
}  // namespace

int main() {
  // Combined index rows: compressed part + W = 128 SWA rows, rounded up to 128.
  const LayerConfig c4{.ratio = 4};      // top-k 512 picks
  const LayerConfig c128{.ratio = 128};  // ceil(65536 / 128) = 512 compressed rows
  const LayerConfig c1{.ratio = 1};      // SWA only
  expect(c4.combined_width() == 640, "C4 combined width 512 + 128 = 640");
  expect(c128.combined_width() == 640, "C128 combined width 512 + 128 = 640");
  expect(c1.combined_width() == 128, "C1 combined width 0 + 128 = 128");

  // The client's symbols: visible compressed rows of requests of length 3 and 9 at C4: 0 + 2.
  const Ds4Symbols syms(c4);
  const Bindings b = syms.bind(2, c4, {3, 9});
  const Extent n_c = sum_over(syms.seq_lens, [](const Extent& l) { return floor_div(l, 4); });
  expect(n_c.evaluate(b) == 2, "sum of floor(L / 4) over {3, 9} = 2");
  expect(&compressed_rows_policy(Sizing::safe) == &capacity_bound, "safe sizing bounds N by capacity");
  expect(&compressed_rows_policy(Sizing::exact) == &exact_at_capture, "exact sizing freezes N at capture");

  // Split-K scratch: [B, splits, H, 512 + 2] fp32; one split needs none.
  expect(cuda::sparse_attention_scratch_bytes(2, 64, 2) == 2u * 2 * 64 * 514 * 4, "scratch of 2 splits");
  expect(cuda::sparse_attention_scratch_bytes(2, 64, 1) == 0, "one split needs no scratch");
  try {
    cuda::choose_splits(4, 32, 640, 132);
    expect(false, "choose_splits accepted 32 heads");
  } catch (const graphsafe::invalid_argument_error& e) {
    expect(std::string(e.what()).find("32") != std::string::npos, "the error names the head count");
  }
  std::printf("install consumer (ds4): %s\n", failures ? "FAILED" : "OK");
  return failures ? 1 : 0;
}
