#include <graphsafe/plan.hpp>

#include "refuse_replay.hpp"

#include <algorithm>
#include <sstream>

namespace graphsafe {

void Plan::add(PlanEntry e) {
  if (e.physical_offset == PlanEntry::kUnsetOffset) e.physical_offset = e.offset;
  entries_.push_back(std::move(e));
}

void Plan::finalize() {
  // Reserved from an earlier, larger capture (the session reserves the arena's last plan size):
  // a graph keeps its plan, so a large excess goes back.
  if (entries_.capacity() > 2 * entries_.size() + 64) entries_.shrink_to_fit();
  guards_.clear();
  symbols_.clear();
  scalars_.clear();
  batches_.clear();
  for (std::size_t i = 0; i < entries_.size(); ++i) {
    const PlanEntry& e = entries_[i];
    if (!e.need) continue;
    for (Symbol s : e.need->symbols())
      if (std::find(symbols_.begin(), symbols_.end(), s) == symbols_.end()) symbols_.push_back(s);
    if (e.replay_safe) continue;  // discharged: implied by every binding being within capacity
    auto same = std::find_if(guards_.begin(), guards_.end(),
                             [&](const Guard& g) { return same_expression(g.need, *e.need); });
    if (same == guards_.end())
      guards_.push_back({*e.need, e.reserved, i});
    else if (e.reserved < same->reserved) {
      same->reserved = e.reserved;
      same->entry = i;
    }
  }
  for (Symbol s : symbols_) {
    if (s.kind() == SymbolKind::batch)
      batches_.emplace_back(s, s.length());
    else if (s.is_dynamic())
      scalars_.push_back(s);
  }
}

namespace {
std::string symbols_of(const Extent& need, const Bindings& now, const Bindings& captured) {
  std::string out;
  for (Symbol s : need.dynamic_symbols()) {
    if (!out.empty()) out += "; ";
    out += now.describe(s);
    if (captured.has(s)) {
      const auto c = captured.describe(s);
      out += " (captured " + c.substr(c.find('=') + 2);
    } else {
      out += " (";
    }
    if (auto cap = s.capacity()) out += ", capacity " + std::to_string(*cap);
    out += ")";
  }
  return out;
}
}  // namespace

std::vector<GuardViolation> Plan::check(const Bindings& b) const {
  std::vector<GuardViolation> out;
  // Static symbols are frozen by capture: a different value means this is not the graph to replay.
  for (Symbol s : symbols_) {
    if (s.is_dynamic() || !captured_.has(s)) continue;
    const std::int64_t now = b.value(s);  // throws unbound_symbol_error naming the symbol
    const std::int64_t then = captured_.value(s);
    if (now != then)
      out.push_back({s.name(), "static", "", now, then,
                     "static symbol " + s.name() + " = " + std::to_string(now) + " but the graph was captured with " +
                         std::to_string(then) + "; static values are frozen -- replay the graph captured for this value"});
  }
  if (!out.empty()) return out;
  // Bindings the extents would reject are refused whatever the guards: a discharged guard evaluates
  // nothing, so this is the one check of them for such a replay.
  for (Symbol s : scalars_) (void)b.value(s);  // throws unbound_symbol_error naming the symbol
  for (const auto& [batch, length] : batches_) {
    const std::size_t n = b.values(batch).size();  // throws unbound_symbol_error naming the batch
    const std::int64_t len = b.value(length);
    if (static_cast<std::int64_t>(n) != len) detail::bad_batch_length(batch, n, len);
  }
  for (const Guard& g : guards_) {
    const std::int64_t need = g.need.evaluate(b);
    if (need > g.reserved) {
      const PlanEntry& e = entries_[g.entry];
      out.push_back({e.name, e.policy, e.site, need, g.reserved, symbols_of(g.need, b, captured_)});
    }
  }
  return out;
}

void Plan::enforce(const Bindings& b) const {
  auto v = check(b);
  if (v.empty()) return;
  std::ostringstream os;
  os << v.size() << " guard" << (v.size() > 1 ? "s" : "") << " failed\n";
  for (const auto& g : v) {
    if (g.policy == "static") {
      os << "  - " << g.symbols << "\n";
      continue;
    }
    os << "  - request '" << g.request << "' (" << g.policy << ", requested at " << g.site << ") needs "
       << g.required << " elements but the graph reserved " << g.reserved << "; " << g.symbols << "\n";
  }
  os << "  fix: size these requests with capacity_bound or static_query_bound, or re-capture at a larger "
        "bucket (CaptureOptions::recapture)";
  detail::refuse_replay(os.str(), std::move(v));
}

std::string Plan::report() const {
  std::ostringstream os;
  os << "plan: " << entries_.size() << " requests, " << bytes_ << " bytes (peak live " << peak_live_ << "), ";
  if (physical_set_) os << physical_ << " physical bytes (virtual sharing), ";
  os << guards_.size() << " live guards\n";
  for (const auto& e : entries_) {
    os << "  " << (e.kind == PlanEntry::Kind::dimension ? "dim " : e.kind == PlanEntry::Kind::opaque ? "raw " : "ws  ")
       << e.name << ": " << e.reserved << (e.kind == PlanEntry::Kind::opaque ? " bytes" : " elems") << " @+" << e.offset;
    if (physical_set_) os << " (physical +" << e.physical_offset << ")";
    os << " [" << e.policy << (e.replay_safe ? ", replay-safe" : ", GUARDED") << "] " << e.note << " at " << e.site
       << (e.reuses ? " (reuses a released range)" : "") << (e.released ? " (released in capture)" : "") << "\n";
  }
  for (const auto& f : findings_) os << "  finding: " << f.request << " at " << f.site << ": " << f.message << "\n";
  return os.str();
}

}  // namespace graphsafe

namespace graphsafe::detail {

void refuse_replay(const std::string& why, std::vector<GuardViolation> violations) {
  throw guard_failure("graphsafe: replay refused before launch: " + why, std::move(violations));
}

}  // namespace graphsafe::detail
