// Index mapping and the two "combine" flavours (paged-direct and gather-to-workspace), plus the
// gather itself. docs/ds4_model.md §2.4, §3.2, §4.2 steps 5-8.
#include <graphsafe/ds4/reference.hpp>

#include "detail.hpp"

#include <algorithm>
#include <climits>
#include <cstddef>

namespace graphsafe::ds4::ref {

using detail::fail;

namespace {

std::int64_t table_slot(const char* name, const std::vector<int32_t>& table, int per_req, int num_blocks,
                        int block, int b, long long idx) {
  const long long blk = idx / block;
  if (blk >= per_req) fail(name, ": entry ", idx, " of request ", b, " needs logical block ", blk, " >= blocks per request ", per_req);
  const std::size_t at = static_cast<std::size_t>(b) * static_cast<std::size_t>(per_req) + static_cast<std::size_t>(blk);
  if (at >= table.size()) fail(name, ": table index ", at, " outside the table of size ", table.size());
  const int32_t phys = table[at];
  if (phys < 0 || phys >= num_blocks) {
    fail(name, "[", b, "][", blk, "] = ", phys, " is not an allocated block in [0, ", num_blocks, ")");
  }
  return static_cast<std::int64_t>(phys) * block + idx % block;
}

void check_batch_index(const DecodeProblem& p, int b) {
  if (b < 0 || b >= p.batch) fail("request b = ", b, " outside [0, batch = ", p.batch, ")");
}

void check_int32(const char* what, long long v) {
  if (v > INT_MAX) fail(what, " = ", v, " overflows int32 (limit ", INT_MAX, ")");
}

// Common checks of the gather-path sizes.
void check_workspace(const DecodeProblem& p, int N, int M) {
  if (N < 0) fail("N = ", N, " must be >= 0");
  if (M < N) fail("M = ", M, " must be >= N = ", N);
  check_int32("B * M", static_cast<long long>(p.batch) * M);
  for (int b = 0; b < p.batch; ++b) {
    const int n_c = visible_compressed(p.seq_lens[b], p.cfg.ratio);
    const int g = swa_len(p.seq_lens[b], p.cfg.window);
    if (n_c > N) {
      fail("request ", b, " (seq_len ", p.seq_lens[b], ") has n_c = ", n_c,
           " compressed rows but the workspace reserves only N = ", N, " per request");
    }
    if (g > M - N) {
      fail("request ", b, " (seq_len ", p.seq_lens[b], ") has swa_len = ", g,
           " SWA rows but the workspace reserves only M - N = ", M - N, " per request");
    }
  }
}

}  // namespace

std::int64_t swa_slot(const DecodeProblem& p, int b, int pos) {
  check_batch_index(p, b);
  if (pos < 0 || pos >= p.cfg.max_model_len) fail("SWA position ", pos, " outside [0, max_model_len = ", p.cfg.max_model_len, ")");
  return table_slot("swa_block_table", p.swa_block_table, p.swa_blocks_per_req, p.swa_num_blocks,
                    p.cfg.swa_block_tokens, b, pos);
}

std::int64_t compressed_slot(const DecodeProblem& p, int b, int j) {
  check_batch_index(p, b);
  if (p.cfg.ratio <= 1) fail("compressed_slot: ratio = ", p.cfg.ratio, " has no compressed cache");
  if (j < 0 || j >= p.cfg.compressed_capacity()) {
    fail("compressed entry ", j, " outside [0, compressed_capacity = ", p.cfg.compressed_capacity(), ")");
  }
  return table_slot("cmp_block_table", p.cmp_block_table, p.cmp_blocks_per_req, p.cmp_num_blocks,
                    p.cfg.compressed_block_entries(), b, j);
}

std::vector<int> compressed_picks(const DecodeProblem& p, int b) {
  check_batch_index(p, b);
  const LayerConfig& c = p.cfg;
  const int n_c = visible_compressed(p.seq_lens[b], c.ratio);
  std::vector<int> out;
  if (c.ratio == 4) {
    const int len = std::min(n_c, c.topk);
    const int32_t* row = p.topk_local.data() + static_cast<std::size_t>(b) * c.topk;
    out.assign(row, row + len);
  } else if (c.ratio > 1) {
    const int len = std::min(n_c, c.compressed_width());
    for (int j = 0; j < len; ++j) out.push_back(j);
  }
  return out;
}

void combine_paged(const DecodeProblem& p, std::int32_t* cmp_idx, std::int32_t* cmp_lens,
                   std::int32_t* swa_idx, std::int32_t* swa_lens) {
  validate(p);
  const int cw = p.cfg.compressed_width();
  const int w = p.cfg.window;
  check_int32("largest compressed slot", static_cast<long long>(p.cmp_num_blocks) * p.cfg.compressed_block_entries());
  check_int32("largest SWA slot", static_cast<long long>(p.swa_num_blocks) * p.cfg.swa_block_tokens);
  if (cw > 0 && cmp_idx == nullptr) fail("combine_paged: cmp_idx is null but compressed_width = ", cw);
  for (int b = 0; b < p.batch; ++b) {
    const int L = p.seq_lens[b];
    const std::vector<int> picks = compressed_picks(p, b);
    std::int32_t* crow = cmp_idx ? cmp_idx + static_cast<std::size_t>(b) * cw : nullptr;
    for (int i = 0; i < cw; ++i) crow[i] = -1;
    for (std::size_t i = 0; i < picks.size(); ++i) crow[i] = static_cast<std::int32_t>(compressed_slot(p, b, picks[i]));
    cmp_lens[b] = static_cast<std::int32_t>(picks.size());

    const int g = swa_len(L, w);
    std::int32_t* srow = swa_idx + static_cast<std::size_t>(b) * w;
    for (int i = 0; i < w; ++i) srow[i] = -1;
    for (int i = 0; i < g; ++i) srow[i] = static_cast<std::int32_t>(swa_slot(p, b, L - g + i));
    swa_lens[b] = g;
  }
}

namespace {

// Where request b's rows start and where its SWA rows start within them, in either layout.
struct RequestRows {
  std::int64_t row0;
  std::int64_t swa;
};

// Rows of request b in the ragged layout: n_c + swa_len (0 for seq_len 0; negative lengths count as
// 0, as on the device).
std::int64_t ragged_rows_of(const DecodeProblem& p, int b) {
  const int L = std::max(p.seq_lens[b], 0);
  return static_cast<std::int64_t>(visible_compressed(L, p.cfg.ratio)) + swa_len(L, p.cfg.window);
}

void gather_into(const DecodeProblem& p, int N, int M, float* ws, bool ragged) {
  validate(p);
  check_workspace(p, N, M);
  std::fill(ws, ws + static_cast<std::size_t>(p.batch) * M * kHeadDim, 0.0f);
  const PagedCache swa = swa_view(p);
  const PagedCache cmp = cmp_view(p);
  std::int64_t next = 0;  // ragged: the first row of request b
  for (int b = 0; b < p.batch; ++b) {
    const int L = p.seq_lens[b];
    const int n_c = visible_compressed(L, p.cfg.ratio);
    const RequestRows at = ragged ? RequestRows{next, n_c} : RequestRows{static_cast<std::int64_t>(b) * M, N};
    next += ragged_rows_of(p, b);
    float* base = ws + static_cast<std::size_t>(at.row0) * kHeadDim;
    for (int j = 0; j < n_c; ++j) dequantize_row(cmp, compressed_slot(p, b, j), base + static_cast<std::size_t>(j) * kHeadDim);
    const int g = swa_len(L, p.cfg.window);
    for (int i = 0; i < g; ++i) {
      dequantize_row(swa, swa_slot(p, b, L - g + i), base + static_cast<std::size_t>(at.swa + i) * kHeadDim);
    }
  }
}

void combine_into(const DecodeProblem& p, int N, int M, std::int32_t* idx, std::int32_t* lens, bool ragged) {
  validate(p);
  check_workspace(p, N, M);
  const int width = p.cfg.combined_width();
  std::int64_t next = 0;
  for (int b = 0; b < p.batch; ++b) {
    const int L = p.seq_lens[b];
    std::int32_t* row = idx + static_cast<std::size_t>(b) * width;
    std::fill(row, row + width, -1);
    const std::vector<int> picks = compressed_picks(p, b);
    const int g = swa_len(L, p.cfg.window);
    if (static_cast<int>(picks.size()) + g > width) {
      fail("request ", b, " needs ", picks.size() + static_cast<std::size_t>(g), " indices but combined_width = ", width);
    }
    const int n_c = visible_compressed(L, p.cfg.ratio);
    const RequestRows at = ragged ? RequestRows{next, n_c} : RequestRows{static_cast<std::int64_t>(b) * M, N};
    next += ragged_rows_of(p, b);
    // Every row is below B*M (check_workspace), which fits int32.
    int k = 0;
    for (int c : picks) row[k++] = static_cast<std::int32_t>(at.row0 + c);
    for (int i = 0; i < g; ++i) row[k++] = static_cast<std::int32_t>(at.row0 + at.swa + i);
    lens[b] = k;
  }
}

}  // namespace

void gather_workspace(const DecodeProblem& p, int N, int M, float* ws) { gather_into(p, N, M, ws, false); }

void combine_gather(const DecodeProblem& p, int N, int M, std::int32_t* idx, std::int32_t* lens) {
  combine_into(p, N, M, idx, lens, false);
}

std::int64_t ragged_row0(const DecodeProblem& p, int b) {
  if (b < 0 || b > p.batch) fail("request b = ", b, " outside [0, batch = ", p.batch, "]");
  if (p.seq_lens.size() < static_cast<std::size_t>(b)) fail("seq_lens.size() = ", p.seq_lens.size(), " < b = ", b);
  std::int64_t row0 = 0;
  for (int j = 0; j < b; ++j) row0 += ragged_rows_of(p, j);
  return row0;
}

std::int64_t ragged_rows(const DecodeProblem& p) { return ragged_row0(p, p.batch); }

void gather_workspace_ragged(const DecodeProblem& p, int N, int M, float* ws) { gather_into(p, N, M, ws, true); }

void combine_gather_ragged(const DecodeProblem& p, int N, int M, std::int32_t* idx, std::int32_t* lens) {
  combine_into(p, N, M, idx, lens, true);
}

}  // namespace graphsafe::ds4::ref
