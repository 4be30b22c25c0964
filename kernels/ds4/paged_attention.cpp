#include <graphsafe/ds4/paged_attention.hpp>

#include <graphsafe/error.hpp>
#include <graphsafe/policies/capacity_bound.hpp>

#include <algorithm>
#include <climits>
#include <string>

namespace graphsafe::ds4 {

namespace {

std::string refuse(const std::string& field, long long value, const std::string& allowed) {
  return "graphsafe::ds4::PagedAttention: " + field + " = " + std::to_string(value) + " is not supported; allowed: " +
         allowed;
}

// Rows one query row may attend: the static width the split count is chosen from (as PagedDecode).
int max_rows(const LayerConfig& c) { return c.combined_width(); }

int sms_of(const AttentionProblem& p) { return p.num_sms > 0 ? p.num_sms : cuda::device_sm_count(); }

void check_bytes(const char* name, const Workspace& w, std::uint64_t need) {
  if (need > 0 && (w.data() == nullptr || w.bytes() < need))
    throw invalid_argument_error("graphsafe::ds4::PagedAttention::run: workspace " + std::string(name) + " holds " +
                                 std::to_string(w.data() == nullptr ? 0 : w.bytes()) + " bytes; the arguments need " +
                                 std::to_string(need) + " (request it with workspaces() of the same problem and batch)");
}

}  // namespace

Implementable PagedAttention::can_implement(const AttentionProblem& p) {
  const LayerConfig& c = p.cfg;
  if (c.ratio != 1 && c.ratio != 4 && c.ratio != 128)
    return {refuse("cfg.ratio", c.ratio, "1 (C1), 4 (C4) or 128 (C128)")};
  if (c.heads != 64 && c.heads != 128)
    return {refuse("cfg.heads", c.heads, "64 or 128 (the kernels' padded head counts; pad the local heads up)")};
  if (p.query_tokens < 1 || p.query_tokens > kMaxQueryTokens)
    return {refuse("query_tokens", p.query_tokens, "1 .. " + std::to_string(kMaxQueryTokens))};
  if (c.window < 1) return {refuse("cfg.window", c.window, ">= 1")};
  if (c.max_model_len < 1) return {refuse("cfg.max_model_len", c.max_model_len, ">= 1")};
  if (c.swa_block_tokens < 1) return {refuse("cfg.swa_block_tokens", c.swa_block_tokens, ">= 1")};
  if (c.ratio == 4 && c.topk < 1) return {refuse("cfg.topk", c.topk, ">= 1 for C4")};
  if (p.num_sms < 0) return {refuse("num_sms", p.num_sms, ">= 0 (0: the current device's)")};
  // Index lists are int32 rows of width compressed_width; a query row's rows must fit int32 too.
  if (static_cast<long long>(c.compressed_width()) + c.window > INT_MAX / 2)
    return {refuse("compressed width + window", static_cast<long long>(c.compressed_width()) + c.window,
                   "<= 2^30 (int32 index lists)")};
  return {};
}

PagedAttention::PagedAttention(const AttentionProblem& problem) : problem_(problem) {
  if (const Implementable ok = can_implement(problem); !ok) throw invalid_argument_error(ok.error);
}

int PagedAttention::splits(int batch) const {
  return cuda::choose_splits(batch * problem_.query_tokens, problem_.cfg.heads, max_rows(problem_.cfg), sms_of(problem_));
}

AttentionWorkspaceExtents PagedAttention::workspaces(const Ds4Symbols& syms) const {
  const LayerConfig& c = problem_.cfg;
  const std::int64_t H = c.heads, sms = sms_of(problem_);
  const std::int64_t tiles = std::max<std::int64_t>(1, (max_rows(c) + 63) / 64);
  AttentionWorkspaceExtents e;
  e.query_rows = Extent(syms.requests) * problem_.query_tokens;
  // cuda::choose_splits with R symbolic: min(max(1, sms / (rows * H/64)), tiles).
  e.splits = min(max(Extent(1), floor_div(Extent(sms), e.query_rows * (H / 64))), Extent(tiles));
  e.cmp_idx = e.query_rows * std::max(c.compressed_width(), 1);
  e.cmp_lens = e.query_rows;
  e.swa_idx = e.query_rows * Extent(syms.window);
  e.swa_lens = e.query_rows;
  // One split merges nothing: no partials. Else [rows, splits, H, 512] and [rows, splits, H, 2]
  // (merged = min(splits / 2, 1): 0 for one split, 1 otherwise).
  const Extent merged = min(floor_div(e.splits, Extent(2)), Extent(1));
  e.partial_o = merged * e.query_rows * e.splits * (H * kHeadDim);
  e.partial_ml = merged * e.query_rows * e.splits * (H * 2);
  return e;
}

AttentionWorkspaces PagedAttention::request(Arena& arena, Stream s, const Ds4Symbols& syms, const Bindings& b) const {
  AttentionWorkspaces w = request_lists(arena, s, syms, b);
  request_partials(w, arena, s, syms, b);
  return w;
}

AttentionWorkspaces PagedAttention::request_lists(Arena& arena, Stream s, const Ds4Symbols& syms, const Bindings& b) const {
  const AttentionWorkspaceExtents e = workspaces(syms);
  AttentionWorkspaces w;
  w.cmp_idx = arena.request(s, "ds4.paged.cmp_idx", e.cmp_idx, 4, capacity_bound, b);
  w.cmp_lens = arena.request(s, "ds4.paged.cmp_lens", e.cmp_lens, 4, capacity_bound, b);
  w.swa_idx = arena.request(s, "ds4.paged.swa_idx", e.swa_idx, 4, capacity_bound, b);
  w.swa_lens = arena.request(s, "ds4.paged.swa_lens", e.swa_lens, 4, capacity_bound, b);
  return w;
}

void PagedAttention::request_partials(AttentionWorkspaces& w, Arena& arena, Stream s, const Ds4Symbols& syms,
                                      const Bindings& b) const {
  const AttentionWorkspaceExtents e = workspaces(syms);
  w.partial_o = arena.request(s, "ds4.attention.partial_o", e.partial_o, 4, capacity_bound, b);
  w.partial_ml = arena.request(s, "ds4.attention.partial_ml", e.partial_ml, 4, capacity_bound, b);
}

AttentionArguments arguments_of(const cuda::DeviceProblem& d, std::uint16_t* out) {
  AttentionArguments a;
  a.batch = d.batch;
  a.seq_lens = d.seq_lens;
  a.topk_local = d.topk_local;
  a.swa = d.swa;
  a.swa_block_table = d.swa_block_table;
  a.swa_blocks_per_req = d.swa_blocks_per_req;
  a.cmp = d.cmp;
  a.cmp_block_table = d.cmp_block_table;
  a.cmp_blocks_per_req = d.cmp_blocks_per_req;
  a.q = d.q;
  a.sink = d.sink;
  a.out = out;
  return a;
}

cuda::PagedIndexArgs PagedAttention::index_args(const AttentionArguments& a, const AttentionWorkspaces& w) const {
  const LayerConfig& c = problem_.cfg;
  if (a.batch < 1)
    throw invalid_argument_error("graphsafe::ds4::PagedAttention::run: batch = " + std::to_string(a.batch) +
                                 " is not allowed; allowed: >= 1");
  const int s_q = problem_.query_tokens;
  const long long rows = static_cast<long long>(a.batch) * s_q;
  if (rows > INT_MAX / 2)
    throw invalid_argument_error("graphsafe::ds4::PagedAttention::run: batch * query_tokens = " + std::to_string(rows) +
                                 " is not allowed; allowed: <= 2^30");
  const int cw = c.compressed_width();
  const std::uint64_t r = static_cast<std::uint64_t>(rows);
  check_bytes("cmp_idx", w.cmp_idx, r * static_cast<std::uint64_t>(std::max(cw, 1)) * 4);
  check_bytes("cmp_lens", w.cmp_lens, r * 4);
  check_bytes("swa_idx", w.swa_idx, r * static_cast<std::uint64_t>(c.window) * 4);
  check_bytes("swa_lens", w.swa_lens, r * 4);

  cuda::PagedIndexArgs ia;
  ia.batch = a.batch;
  ia.query_tokens = s_q;
  ia.ratio = c.ratio;
  ia.window = c.window;
  ia.topk = c.topk;
  ia.cmp_width = cw;
  ia.seq_lens = a.seq_lens;
  ia.topk_local = a.topk_local;
  ia.swa_block_table = a.swa_block_table;
  ia.swa_blocks_per_req = a.swa_blocks_per_req;
  ia.swa_block_tokens = c.swa_block_tokens;
  ia.cmp_block_table = a.cmp_block_table;
  ia.cmp_blocks_per_req = a.cmp_blocks_per_req;
  ia.cmp_block_entries = c.compressed_block_entries();
  ia.cmp_idx = c.ratio > 1 ? w.cmp_idx.as<std::int32_t>() : nullptr;
  ia.cmp_lens = c.ratio > 1 ? w.cmp_lens.as<std::int32_t>() : nullptr;
  ia.swa_idx = w.swa_idx.as<std::int32_t>();
  ia.swa_lens = w.swa_lens.as<std::int32_t>();
  return ia;
}

void PagedAttention::check_partials(const AttentionArguments& a, const AttentionWorkspaces& w, int splits) const {
  const std::uint64_t partials = splits > 1 ? static_cast<std::uint64_t>(a.batch) * problem_.query_tokens *
                                                  static_cast<std::uint64_t>(splits) *
                                                  static_cast<std::uint64_t>(problem_.cfg.heads)
                                            : 0;
  check_bytes("partial_o", w.partial_o, partials * kHeadDim * 4);
  check_bytes("partial_ml", w.partial_ml, partials * 2 * 4);
}

void PagedAttention::run(const AttentionArguments& a, const AttentionWorkspaces& w, cudaStream_t stream) const {
  const cuda::PagedIndexArgs ia = index_args(a, w);
  const int splits = this->splits(a.batch);
  check_partials(a, w, splits);  // every check before the first launch
  cuda::combine_paged(ia, stream);
  launch_attention(a, w, ia, splits, stream);
}

void PagedAttention::attend(const AttentionArguments& a, const AttentionWorkspaces& w, cudaStream_t stream) const {
  const cuda::PagedIndexArgs ia = index_args(a, w);  // checks the batch and the lists
  const int splits = this->splits(a.batch);
  check_partials(a, w, splits);
  launch_attention(a, w, ia, splits, stream);
}

void PagedAttention::launch_attention(const AttentionArguments& a, const AttentionWorkspaces& w,
                                      const cuda::PagedIndexArgs& ia, int splits, cudaStream_t stream) const {
  const LayerConfig& c = problem_.cfg;
  cuda::PagedAttentionArgs pa;
  pa.c.batch = a.batch * problem_.query_tokens;
  pa.c.heads = c.heads;
  pa.c.q = a.q;
  pa.c.sink = a.sink;
  pa.c.out = a.out;
  pa.c.splits = splits;
  pa.c.scratch = w.partial_o.data();
  pa.c.scratch_ml = w.partial_ml.data();
  pa.swa = a.swa;
  pa.swa_idx = ia.swa_idx;
  pa.swa_width = c.window;
  pa.swa_lens = ia.swa_lens;
  pa.cmp = a.cmp;
  pa.cmp_idx = ia.cmp_idx;
  pa.cmp_width = ia.cmp_width;
  pa.cmp_lens = ia.cmp_lens;
  cuda::sparse_attention_paged(pa, stream, a.options);
}

}  // namespace graphsafe::ds4
