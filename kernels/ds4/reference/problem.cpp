// Problem validation and the deterministic random problem (make_problem/grow).
#include <graphsafe/ds4/problem.hpp>
#include <graphsafe/ds4/reference.hpp>

#include "detail.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <numbers>
#include <random>

namespace graphsafe::ds4 {

namespace ref {
namespace {

using detail::ceil_div;
using detail::fail;

void validate_config(const LayerConfig& c) {
  if (c.ratio != 1 && c.ratio != 4 && c.ratio != 128) fail("LayerConfig.ratio = ", c.ratio, " must be 1, 4 or 128");
  if (c.window < 1) fail("LayerConfig.window = ", c.window, " must be >= 1");
  if (c.heads < 1) fail("LayerConfig.heads = ", c.heads, " must be >= 1");
  if (c.max_model_len < 1) fail("LayerConfig.max_model_len = ", c.max_model_len, " must be >= 1");
  if (c.swa_block_tokens < 1) fail("LayerConfig.swa_block_tokens = ", c.swa_block_tokens, " must be >= 1");
  if (c.ratio == 4 && c.topk < 1) fail("LayerConfig.topk = ", c.topk, " must be >= 1 for C4");
}

void check_seq_lens(const LayerConfig& c, const std::vector<int32_t>& lens, int limit, const char* limit_name) {
  for (std::size_t b = 0; b < lens.size(); ++b) {
    if (lens[b] < 0) fail("seq_lens[", b, "] = ", lens[b], " must be >= 0");
    if (lens[b] > c.max_model_len) fail("seq_lens[", b, "] = ", lens[b], " exceeds max_model_len = ", c.max_model_len);
    if (lens[b] > limit) fail("seq_lens[", b, "] = ", lens[b], " exceeds ", limit_name, " = ", limit);
  }
}

template <class T>
void check_size(const char* what, const std::vector<T>& v, long long expected) {
  if (static_cast<long long>(v.size()) != expected) fail(what, ".size() = ", v.size(), " but expected ", expected);
}

// ---- deterministic randomness, identical on every platform --------------------------------

// Inverse standard normal CDF: Acklam's rational approximation refined by one Halley step.
double inverse_normal_cdf(double p) {
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02, -2.759285104469687e+02,
                                 1.383577518672690e+02,  -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02, -1.556989798598866e+02,
                                 6.680131188771972e+01,  -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e+00,
                                 -2.549732539343734e+00, 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e+00,
                                 3.754408661907416e+00};
  constexpr double p_low = 0.02425;
  double x;
  if (p < p_low) {
    const double q = std::sqrt(-2 * std::log(p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  } else if (p <= 1 - p_low) {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  } else {
    const double q = std::sqrt(-2 * std::log1p(-p));
    x = -(((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
  }
  const double e = 0.5 * std::erfc(-x / std::sqrt(2.0)) - p;
  const double u = e * std::sqrt(2 * std::numbers::pi) * std::exp(x * x / 2);
  return x - u / (1 + x * u / 2);
}

// 65536 N(0,1) quantiles at the cell midpoints (i + 0.5) / 65536.
const std::array<float, 65536>& normal_table() {
  static const std::array<float, 65536> table = [] {
    std::array<float, 65536> t{};
    for (std::size_t i = 0; i < t.size(); ++i) {
      t[i] = static_cast<float>(inverse_normal_cdf((static_cast<double>(i) + 0.5) / 65536.0));
    }
    return t;
  }();
  return table;
}

// mt19937_64 is fully specified by the standard; the distributions are not, so we build our own.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : gen_(seed) {}
  // ~N(0, 1): four 16-bit table lookups per engine draw.
  float normal() {
    if (left_ == 0) { bits_ = gen_(); left_ = 4; }
    const auto i = static_cast<std::size_t>(bits_ & 0xFFFFu);
    bits_ >>= 16;
    --left_;
    return table_[i];
  }
  double uniform() { return static_cast<double>(gen_() >> 11) * 0x1.0p-53; }  // [0, 1)
  std::uint64_t below(std::uint64_t n) {  // uniform in [0, n), n >= 1, unbiased
    const std::uint64_t limit = ~std::uint64_t{0} - (~std::uint64_t{0} % n);
    std::uint64_t v;
    do { v = gen_(); } while (v >= limit);
    return v % n;
  }
  template <class T>
  void shuffle(std::vector<T>& v) {  // Fisher-Yates
    for (std::size_t i = v.size(); i > 1; --i) std::swap(v[i - 1], v[static_cast<std::size_t>(below(i))]);
  }

 private:
  std::mt19937_64 gen_;
  const std::array<float, 65536>& table_ = normal_table();
  std::uint64_t bits_ = 0;
  int left_ = 0;
};

// splitmix64 finaliser: independent seeds for the per-purpose / per-request streams.
std::uint64_t mix(std::uint64_t seed, std::uint64_t stream) {
  std::uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}
enum Stream : std::uint64_t { kTables = 0, kQuery = 1, kPicks = 2, kSwaRows = 1000, kCmpRows = 1u << 20 };

void fill_picks(DecodeProblem& p, std::uint64_t seed, Picks picks) {
  const LayerConfig& c = p.cfg;
  if (c.ratio != 4) { p.topk_local.clear(); return; }
  p.topk_local.assign(static_cast<std::size_t>(p.batch) * c.topk, -1);
  Rng rng(mix(seed, kPicks));
  for (int b = 0; b < p.batch; ++b) {
    const int n_c = visible_compressed(p.seq_lens[b], c.ratio);
    const int len = std::min(n_c, c.topk);
    int32_t* row = p.topk_local.data() + static_cast<std::size_t>(b) * c.topk;
    if (picks == Picks::last8) {
      for (int i = 0; i < len; ++i) row[i] = n_c - len + i;
    } else if (n_c <= c.topk) {
      for (int i = 0; i < n_c; ++i) row[i] = i;
    } else {  // partial Fisher-Yates: K distinct ids in random order
      std::vector<int32_t> ids(static_cast<std::size_t>(n_c));
      for (int i = 0; i < n_c; ++i) ids[static_cast<std::size_t>(i)] = i;
      for (int i = 0; i < len; ++i) {
        const auto k = static_cast<std::size_t>(i) + static_cast<std::size_t>(rng.below(static_cast<std::uint64_t>(n_c - i)));
        std::swap(ids[static_cast<std::size_t>(i)], ids[k]);
        row[i] = ids[static_cast<std::size_t>(i)];
      }
    }
  }
}

}  // namespace

void validate(const DecodeProblem& p) {
  const LayerConfig& c = p.cfg;
  validate_config(c);
  if (p.batch < 0) fail("batch = ", p.batch, " must be >= 0");
  check_size("seq_lens", p.seq_lens, p.batch);
  check_seq_lens(c, p.seq_lens, c.max_model_len, "max_model_len");

  const long long swa_bpr = ceil_div(c.max_model_len, c.swa_block_tokens);
  if (p.swa_blocks_per_req != swa_bpr) {
    fail("swa_blocks_per_req = ", p.swa_blocks_per_req, " but ceil(max_model_len / swa_block_tokens) = ", swa_bpr);
  }
  check_size("swa_block_table", p.swa_block_table, static_cast<long long>(p.batch) * swa_bpr);
  if (p.swa_num_blocks < 0) fail("swa_num_blocks = ", p.swa_num_blocks, " must be >= 0");
  if (p.swa_cache.size() < static_cast<std::size_t>(p.swa_num_blocks) * block_stride_bytes(c.swa_block_tokens)) {
    fail("swa_cache.size() = ", p.swa_cache.size(), " is below swa_num_blocks * stride = ",
         static_cast<std::size_t>(p.swa_num_blocks) * block_stride_bytes(c.swa_block_tokens));
  }
  if (c.ratio > 1) {
    const int e = c.compressed_block_entries();
    const long long cmp_bpr = ceil_div(c.compressed_capacity(), e);
    if (p.cmp_blocks_per_req != cmp_bpr) {
      fail("cmp_blocks_per_req = ", p.cmp_blocks_per_req, " but ceil(compressed_capacity / entries) = ", cmp_bpr);
    }
    check_size("cmp_block_table", p.cmp_block_table, static_cast<long long>(p.batch) * cmp_bpr);
    if (p.cmp_num_blocks < 0) fail("cmp_num_blocks = ", p.cmp_num_blocks, " must be >= 0");
    if (p.cmp_cache.size() < static_cast<std::size_t>(p.cmp_num_blocks) * block_stride_bytes(e)) {
      fail("cmp_cache.size() = ", p.cmp_cache.size(), " is below cmp_num_blocks * stride = ",
           static_cast<std::size_t>(p.cmp_num_blocks) * block_stride_bytes(e));
    }
  }
  if (c.ratio == 4) {
    check_size("topk_local", p.topk_local, static_cast<long long>(p.batch) * c.topk);
    for (int b = 0; b < p.batch; ++b) {
      const int n_c = visible_compressed(p.seq_lens[b], c.ratio);
      const int len = std::min(n_c, c.topk);
      for (int i = 0; i < len; ++i) {
        const int32_t id = p.topk_local[static_cast<std::size_t>(b) * c.topk + i];
        if (id < 0 || id >= n_c) {
          fail("topk_local[", b, "][", i, "] = ", id, " outside the visible compressed rows [0, n_c = ", n_c,
               ") (the first min(n_c, K) = ", len, " entries must be valid)");
        }
      }
    }
  }
  check_size("q", p.q, static_cast<long long>(p.batch) * c.heads * kHeadDim);
  check_size("sink", p.sink, c.heads);
}

PagedCache swa_view(const DecodeProblem& p) {
  return {const_cast<std::uint8_t*>(p.swa_cache.data()), p.cfg.swa_block_tokens, p.swa_num_blocks,
          block_stride_bytes(p.cfg.swa_block_tokens)};
}

PagedCache cmp_view(const DecodeProblem& p) {
  const int e = p.cfg.compressed_block_entries();
  return {const_cast<std::uint8_t*>(p.cmp_cache.data()), e, p.cmp_num_blocks, block_stride_bytes(e)};
}

}  // namespace ref

DecodeProblem make_problem(const LayerConfig& cfg, const std::vector<int32_t>& seq_lens, std::uint64_t seed,
                           Picks picks, int fill_to) {
  using ref::detail::ceil_div;
  using ref::detail::fail;
  ref::validate_config(cfg);
  if (fill_to < 0) fail("make_problem: fill_to = ", fill_to, " must be >= 0");
  if (fill_to > cfg.max_model_len) fail("make_problem: fill_to = ", fill_to, " exceeds max_model_len = ", cfg.max_model_len);
  ref::check_seq_lens(cfg, seq_lens, cfg.max_model_len, "max_model_len");
  const int longest = seq_lens.empty() ? 0 : *std::max_element(seq_lens.begin(), seq_lens.end());
  if (fill_to == 0) fill_to = longest;
  ref::check_seq_lens(cfg, seq_lens, fill_to, "fill_to");

  DecodeProblem p;
  p.cfg = cfg;
  p.batch = static_cast<int>(seq_lens.size());
  p.seq_lens = seq_lens;
  p.fill_to = fill_to;
  const auto B = static_cast<std::size_t>(p.batch);
  ref::Rng tables(ref::mix(seed, ref::kTables));

  // Paged cache with `used` allocated blocks per request out of `per_req` table entries; physical
  // ids are a random permutation, unallocated entries are -1.
  auto make_table = [&](int per_req, int used, std::vector<int32_t>& table, int& num_blocks) {
    num_blocks = p.batch * used;
    std::vector<int32_t> perm(static_cast<std::size_t>(num_blocks));
    for (int i = 0; i < num_blocks; ++i) perm[static_cast<std::size_t>(i)] = i;
    tables.shuffle(perm);
    table.assign(B * static_cast<std::size_t>(per_req), -1);
    for (std::size_t b = 0; b < B; ++b) {
      for (int k = 0; k < used; ++k) table[b * per_req + k] = perm[b * used + k];
    }
  };

  // SWA cache: every token 0..fill_to-1 of every request.
  p.swa_blocks_per_req = static_cast<int>(ceil_div(cfg.max_model_len, cfg.swa_block_tokens));
  make_table(p.swa_blocks_per_req, static_cast<int>(ceil_div(fill_to, cfg.swa_block_tokens)), p.swa_block_table,
             p.swa_num_blocks);
  p.swa_cache.assign(static_cast<std::size_t>(p.swa_num_blocks) * block_stride_bytes(cfg.swa_block_tokens), 0);
  std::vector<float> row(kHeadDim);
  {
    const PagedCache view = ref::swa_view(p);
    for (int b = 0; b < p.batch; ++b) {
      ref::Rng rng(ref::mix(seed, ref::kSwaRows + static_cast<std::uint64_t>(b)));
      for (int t = 0; t < fill_to; ++t) {
        for (float& v : row) v = rng.normal();
        ref::quantize_insert(row.data(), view, ref::swa_slot(p, b, t));
      }
    }
  }

  // Compressed cache: entries 0 .. fill_to/r - 1 of every request (random rows, not compressor output).
  if (cfg.ratio > 1) {
    const int e = cfg.compressed_block_entries();
    const int n_fill = visible_compressed(fill_to, cfg.ratio);
    p.cmp_blocks_per_req = static_cast<int>(ceil_div(cfg.compressed_capacity(), e));
    make_table(p.cmp_blocks_per_req, static_cast<int>(ceil_div(n_fill, e)), p.cmp_block_table, p.cmp_num_blocks);
    p.cmp_cache.assign(static_cast<std::size_t>(p.cmp_num_blocks) * block_stride_bytes(e), 0);
    const PagedCache view = ref::cmp_view(p);
    for (int b = 0; b < p.batch; ++b) {
      ref::Rng rng(ref::mix(seed, ref::kCmpRows + static_cast<std::uint64_t>(b)));
      for (int j = 0; j < n_fill; ++j) {
        for (float& v : row) v = rng.normal();
        ref::quantize_insert(row.data(), view, ref::compressed_slot(p, b, j));
      }
    }
  }

  ref::Rng qrng(ref::mix(seed, ref::kQuery));
  p.q.resize(B * static_cast<std::size_t>(cfg.heads) * kHeadDim);
  for (auto& v : p.q) v = ref::bf16_from_float(qrng.normal());
  p.sink.resize(static_cast<std::size_t>(cfg.heads));
  for (auto& s : p.sink) s = static_cast<float>(-2.0 + 4.0 * qrng.uniform());

  ref::fill_picks(p, seed, picks);
  ref::validate(p);
  return p;
}

void grow(DecodeProblem& p, const std::vector<int32_t>& new_seq_lens, std::uint64_t seed, Picks picks) {
  ref::validate_config(p.cfg);
  if (static_cast<int>(new_seq_lens.size()) != p.batch) {
    ref::detail::fail("grow: new_seq_lens.size() = ", new_seq_lens.size(), " but batch = ", p.batch);
  }
  ref::check_seq_lens(p.cfg, new_seq_lens, p.fill_to, "fill_to");
  p.seq_lens = new_seq_lens;
  ref::fill_picks(p, seed, picks);
}

QueryTokenRows query_token_rows(const std::vector<int32_t>& seq_lens, int query_tokens) {
  using ref::detail::fail;
  if (query_tokens < 1 || query_tokens > kMaxQueryTokens)
    fail("query_token_rows: query_tokens = ", query_tokens, " outside [1, kMaxQueryTokens = ", kMaxQueryTokens, "]");
  QueryTokenRows q;
  q.query_tokens = query_tokens;
  for (std::size_t b = 0; b < seq_lens.size(); ++b) {
    const int L = seq_lens[b];
    if (L < 0) fail("query_token_rows: seq_lens[", b, "] = ", L, " must be >= 0");
    for (int t = 0; t < query_tokens; ++t) {
      q.request.push_back(static_cast<int32_t>(b));
      // position L - s_q + t; the one-token length is that position + 1
      q.seq_lens.push_back(L == 0 ? 0 : std::max(L - query_tokens + 1 + t, 0));
    }
  }
  return q;
}

DecodeProblem query_rows_problem(const DecodeProblem& p, int query_tokens, std::uint64_t seed, Picks picks) {
  ref::validate(p);
  const QueryTokenRows rows = query_token_rows(p.seq_lens, query_tokens);
  DecodeProblem e = p;
  e.batch = static_cast<int>(rows.seq_lens.size());
  e.seq_lens = rows.seq_lens;
  auto copy_rows = [&](const std::vector<int32_t>& table, int per_req) {
    std::vector<int32_t> out;
    out.reserve(static_cast<std::size_t>(e.batch) * static_cast<std::size_t>(per_req));
    for (const int32_t b : rows.request)
      out.insert(out.end(), table.begin() + static_cast<std::ptrdiff_t>(b) * per_req,
                 table.begin() + static_cast<std::ptrdiff_t>(b + 1) * per_req);
    return out;
  };
  e.swa_block_table = copy_rows(p.swa_block_table, p.swa_blocks_per_req);
  if (p.cfg.ratio > 1) e.cmp_block_table = copy_rows(p.cmp_block_table, p.cmp_blocks_per_req);
  ref::Rng qrng(ref::mix(seed, ref::kQuery));
  e.q.resize(static_cast<std::size_t>(e.batch) * static_cast<std::size_t>(p.cfg.heads) * kHeadDim);
  for (auto& v : e.q) v = ref::bf16_from_float(qrng.normal());
  ref::fill_picks(e, seed, picks);
  ref::validate(e);
  return e;
}

}  // namespace graphsafe::ds4
