// Virtual growth: see virtual_commit.hpp and docs/virtual_growth.md.
#include "virtual_commit.hpp"
#include "refuse_replay.hpp"

#include "arena_core.hpp"

#include <graphsafe/error.hpp>

#include <algorithm>
#include <limits>
#include <mutex>

namespace graphsafe {
namespace detail {

namespace {

std::uint64_t mul_bytes(std::int64_t elems, std::uint64_t element_bytes, const std::string& name) {
  std::uint64_t out;
  if (elems < 0 || __builtin_mul_overflow(static_cast<std::uint64_t>(elems), element_bytes, &out))
    throw overflow_error("graphsafe: footprint of '" + name + "' (" + std::to_string(elems) + " x " +
                         std::to_string(element_bytes) + " bytes) overflows 64-bit byte counts");
  return out;
}

[[noreturn]] void footprint_overflow(const VirtualItem& it, std::int64_t request, std::uint64_t end_bytes,
                                     const std::string& values) {
  GuardViolation v;
  v.request = it.name;
  v.policy = "footprint";
  v.required = static_cast<std::int64_t>(end_bytes / it.element_bytes);
  v.reserved = static_cast<std::int64_t>(it.bytes / it.element_bytes);
  v.symbols = values;
  std::string where = request >= 0 ? " for request " + std::to_string(request) : std::string();
  refuse_replay("the footprint of '" + it.name + "'" + where + " reaches element " + std::to_string(v.required) +
                    " but the capture reserved " + std::to_string(v.reserved) + " elements of address space (" +
                    values + "); the footprint is wrong or the request's bound is too small",
                {v});
}

// Evaluates per-request lengths: the bindings of the replay with the element symbol set.
struct ElementEval {
  Bindings b;
  explicit ElementEval(const Bindings& src) : b(src) {}
  // Length in elements for value v; nullopt when it overflows.
  std::optional<std::int64_t> at(const VirtualItem::Range& r, Symbol elem, std::int64_t v) {
    try {
      b.set(elem, v);
      return r.length.evaluate(b);
    } catch (const overflow_error&) {
      return std::nullopt;
    }
  }
};

std::int64_t search_cap(Symbol batch) {
  if (auto c = batch.capacity()) return *c;
  return std::int64_t(1) << 40;
}

}  // namespace

// ---- VirtualFamily -------------------------------------------------------------------------------

VirtualFamily::~VirtualFamily() {
  try {
    std::lock_guard g(m);
    unmap_except({});
  } catch (...) {
  }
  if (auto c = core.lock(); c && c->observer) c->observer->slab_removed(base);
  if (vm && base) vm->unreserve(base, va_bytes);
}

std::uint64_t VirtualFamily::commit(std::uint64_t off, std::uint64_t len) {
  if (len == 0) return 0;
  if (off + len > va_bytes)
    throw out_of_memory_error("graphsafe: family '" + name + "' needs bytes up to " + std::to_string(off + len) +
                              " but its virtual reservation holds " + std::to_string(va_bytes) +
                              "; raise ArenaOptions::virtual_reserve_bytes");
  const std::uint64_t g0 = off / granule, g1 = (off + len - 1) / granule + 1;
  if (chunk.size() < g1) chunk.resize(g1, 0);
  std::uint64_t added = 0;
  for (std::uint64_t g = g0; g < g1;) {
    if (chunk[g]) {
      ++g;
      continue;
    }
    if (is_shared(g)) {
      // One granule showing a physical slot: the slot's chunk when it has one, else a new chunk.
      const std::uint64_t s = slot_of[g] - 1;
      std::uint64_t h;
      if (slot_chunk[s]) {
        h = slot_chunk[s] - 1;
        vm->alias(base + g * granule, 1, &h);
      } else {
        vm->map(base + g * granule, 1, &h);
        slot_chunk[s] = h + 1;
        ++physical;
      }
      ++slot_maps[s];
      chunk[g] = h + 1;
      ++added;
      ++mapped;
      ++g;
      continue;
    }
    std::uint64_t e = g;
    while (e < g1 && !chunk[e] && !is_shared(e)) ++e;
    std::vector<std::uint64_t> handles(e - g);
    vm->map(base + g * granule, e - g, handles.data());  // all or nothing
    for (std::uint64_t i = g; i < e; ++i) chunk[i] = handles[i - g] + 1;
    added += e - g;
    mapped += e - g;
    physical += e - g;
    g = e;
  }
  return added;
}

std::uint64_t VirtualFamily::covered_end(std::uint64_t off, std::uint64_t limit) const {
  std::uint64_t g = off / granule;
  if (!is_mapped(g)) return off;
  while ((g + 1) * granule < limit && is_mapped(g + 1)) ++g;
  return std::min((g + 1) * granule, limit);
}

void VirtualFamily::unmap_except(const std::vector<bool>& keep) {
  std::uint64_t dropped = 0;
  std::exception_ptr first;
  for (std::uint64_t g = 0; g < chunk.size();) {
    if (!chunk[g] || (g < keep.size() && keep[g])) {
      ++g;
      continue;
    }
    std::uint64_t e = g;
    std::vector<std::uint64_t> handles;
    const bool shared = is_shared(g);  // a shared granule is unmapped alone (its slot's count drops)
    while (e < chunk.size() && chunk[e] && !(e < keep.size() && keep[e]) && is_shared(e) == shared &&
           (!shared || e == g))
      handles.push_back(chunk[e++] - 1);
    try {
      vm->unmap(base + g * granule, e - g, handles.data());
    } catch (...) {
      if (!first) first = std::current_exception();
    }
    for (std::uint64_t i = g; i < e; ++i) chunk[i] = 0;
    if (shared) {
      const std::uint64_t s = slot_of[g] - 1;
      if (--slot_maps[s] == 0) {
        slot_chunk[s] = 0;  // its last mapping is gone: the chunk went back to the pool
        --physical;
      }
    } else {
      physical -= e - g;
    }
    mapped -= e - g;
    dropped += e - g;
    g = e;
  }
  if (dropped) {
    epoch.fetch_add(1, std::memory_order_acq_rel);
    for (VirtualPlan* p : plans) p->guards_unmapped.store(true, std::memory_order_relaxed);
  }
  if (first) std::rethrow_exception(first);
}

void VirtualFamily::forget_slots(std::uint64_t first) {
  if (first < slot_of.size()) slot_of.resize(first);
  if (first == 0) {
    slot_of.clear();
    slot_chunk.clear();
    slot_maps.clear();
  }
}

// ---- VirtualPlan ---------------------------------------------------------------------------------

VirtualPlan::~VirtualPlan() {
  if (!registered || !fam) return;
  std::lock_guard g(fam->m);
  fam->plans.erase(std::remove(fam->plans.begin(), fam->plans.end(), this), fam->plans.end());
}

namespace {

// Commit what element i of a per-request item needs at value v (fam->m held).
void commit_element(VirtualFamily& f, const VirtualItem& it, std::size_t i, std::int64_t v, ElementEval& ev) {
  const std::uint64_t base = it.offset + i * it.stride_bytes;
  for (const VirtualItem::Range& r : it.ranges) {
    const auto len = ev.at(r, *it.elem, v);
    if (!len) footprint_overflow(it, static_cast<std::int64_t>(i), std::numeric_limits<std::uint64_t>::max(),
                                 it.batch->name() + "[" + std::to_string(i) + "] = " + std::to_string(v));
    if (*len <= 0) continue;
    const std::uint64_t start = base + r.offset_bytes;
    const std::uint64_t bytes = mul_bytes(*len, it.element_bytes, it.name);
    if (start + bytes > it.offset + it.bytes)
      footprint_overflow(it, static_cast<std::int64_t>(i), start + bytes - it.offset,
                         it.batch->name() + "[" + std::to_string(i) + "] = " + std::to_string(v));
    f.commit(start, bytes);
  }
}

// Largest value (>= v) element i of `it` may take with what is mapped now (fam->m held).
std::int64_t element_threshold(const VirtualFamily& f, const VirtualItem& it, std::size_t i, std::int64_t v,
                               ElementEval& ev) {
  const std::int64_t cap = search_cap(*it.batch);
  std::int64_t best = std::max(cap, v);
  const std::uint64_t base = it.offset + i * it.stride_bytes, item_end = it.offset + it.bytes;
  for (const VirtualItem::Range& r : it.ranges) {
    const std::uint64_t start = base + r.offset_bytes;
    const std::uint64_t limit = start >= item_end ? start : f.covered_end(start, item_end);
    auto ok = [&](std::int64_t x) {
      const auto len = ev.at(r, *it.elem, x);
      if (!len) return false;
      if (*len <= 0) return true;
      std::uint64_t bytes;
      if (__builtin_mul_overflow(static_cast<std::uint64_t>(*len), it.element_bytes, &bytes)) return false;
      return start + bytes <= limit;
    };
    std::int64_t lo = v, hi = best;  // ok(lo) holds (just committed); find the largest ok value
    if (!ok(lo)) return v;           // (defensive: never trust more than what was checked)
    if (ok(hi)) continue;
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      (ok(mid) ? lo : hi) = mid;
    }
    best = std::min(best, lo);
  }
  return best;
}

std::int64_t prefix_threshold(const VirtualFamily& f, const VirtualItem& it) {
  const std::uint64_t end = f.covered_end(it.offset, it.offset + it.bytes);
  return static_cast<std::int64_t>((end - it.offset) / it.element_bytes);
}

// Monotone prefix: the largest uniform headroom d such that every batch element at (value + d,
// capped at its capacity) still fits what is mapped; scalars are verified at their current values.
void prefix_thresholds(VirtualItem& it, const Bindings& b) {
  it.mono_valid = false;
  it.mono_scalar_ok.clear();
  for (Symbol s : it.mono_scalar) it.mono_scalar_ok.push_back(b.value(s));
  std::vector<std::vector<std::int64_t>> base;
  std::vector<std::int64_t> caps;
  std::int64_t hi = 0;
  for (Symbol s : it.mono_batch) {
    const auto v = b.values(s);
    base.emplace_back(v.begin(), v.end());
    caps.push_back(search_cap(s));
    for (std::int64_t x : v) hi = std::max(hi, caps.back() - x);
  }
  Bindings t(b);
  std::vector<std::int64_t> w;
  auto at = [&](std::int64_t d) {
    for (std::size_t k = 0; k < base.size(); ++k) {
      w.resize(base[k].size());
      for (std::size_t i = 0; i < w.size(); ++i) w[i] = std::max(base[k][i], std::min(caps[k], base[k][i] + d));
      t.set(it.mono_batch[k], std::span<const std::int64_t>(w));
    }
  };
  auto ok = [&](std::int64_t d) {
    try {
      at(d);
      return it.length->evaluate(t) <= it.prefix_ok;
    } catch (const error&) {
      return false;
    }
  };
  std::int64_t lo = 0;
  if (!ok(0)) return;  // (defensive: evaluate every replay rather than trust an unchecked bound)
  if (ok(hi)) {
    lo = hi;
  } else {
    while (hi - lo > 1) {
      const std::int64_t mid = lo + (hi - lo) / 2;
      (ok(mid) ? lo : hi) = mid;
    }
  }
  it.mono_thr.assign(base.size(), {});
  for (std::size_t k = 0; k < base.size(); ++k)
    for (std::int64_t x : base[k]) it.mono_thr[k].push_back(std::max(x, std::min(caps[k], x + lo)));
  it.mono_valid = true;
}

void commit_prefix(VirtualFamily& f, VirtualItem& it, const Bindings& b) {
  const std::int64_t need = it.length->evaluate(b);
  const std::uint64_t bytes = mul_bytes(need, it.element_bytes, it.name);
  if (bytes > it.bytes) footprint_overflow(it, -1, bytes, it.length->to_string() + " = " + std::to_string(need));
  f.commit(it.offset, bytes);
  it.prefix_ok = prefix_threshold(f, it);
  if (it.mono) prefix_thresholds(it, b);
}

std::span<const std::int64_t> batch_values(const VirtualItem& it, const Bindings& b) {
  const auto v = b.values(*it.batch);
  if (v.size() != it.count)
    refuse_replay("'" + it.name + "' was captured for " + std::to_string(it.count) + " requests of " +
                      it.batch->name() + " but the bindings have " + std::to_string(v.size()) +
                      "; replay the graph captured for this batch",
                  {});
  return v;
}

// Everything the item needs under b, plus what is always mapped (first granule, guard region).
void commit_item(VirtualFamily& f, VirtualItem& it, const Bindings& b) {
  if (it.bytes) f.commit(it.offset, 1);  // base pointers are common dummies for predicated-off loads
  f.commit(it.offset + it.bytes, it.extra);
  switch (it.kind) {
    case VirtualItem::Kind::fixed:
      f.commit(it.offset, it.fixed_bytes);
      break;
    case VirtualItem::Kind::prefix:
      commit_prefix(f, it, b);
      break;
    case VirtualItem::Kind::per_request: {
      const auto v = batch_values(it, b);
      ElementEval ev(b);
      for (std::size_t i = 0; i < v.size(); ++i) commit_element(f, it, i, v[i], ev);
      break;
    }
  }
}

}  // namespace

void VirtualPlan::commit_slow(const Bindings& b, bool full) {
  VirtualFamily& f = *fam;
  std::lock_guard g(f.m);
  const std::uint64_t before = f.mapped;
  const std::uint64_t ep = f.epoch.load(std::memory_order_acquire);
  ++slow;
  if (full || epoch != ep) {
    epoch = 0;
    for (auto [off, len] : gaps) f.commit(va_start + off, len);
    for (VirtualItem& it : items) commit_item(f, it, b);
    ElementEval ev(b);
    for (VirtualGate& gt : gates) {
      const auto v = b.values(gt.batch);
      gt.thr.assign(v.size(), std::numeric_limits<std::int64_t>::max());
      for (std::size_t i = 0; i < v.size(); ++i)
        for (std::size_t k : gt.items) gt.thr[i] = std::min(gt.thr[i], element_threshold(f, items[k], i, v[i], ev));
    }
  } else {
    ElementEval ev(b);
    for (VirtualGate& gt : gates) {
      const auto v = b.values(gt.batch);
      for (std::size_t i = 0; i < v.size(); ++i) {
        if (v[i] <= gt.thr[i]) continue;
        for (std::size_t k : gt.items) commit_element(f, items[k], i, v[i], ev);
        std::int64_t t = std::numeric_limits<std::int64_t>::max();
        for (std::size_t k : gt.items) t = std::min(t, element_threshold(f, items[k], i, v[i], ev));
        gt.thr[i] = t;
      }
    }
    for (std::size_t k : prefix_items)
      if (!prefix_within(items[k], b)) commit_prefix(f, items[k], b);
  }
  // Mapping never removes anything, so thresholds computed now hold until the next unmap.
  epoch = f.epoch.load(std::memory_order_acquire);
  if (f.mapped > before) ++grew;
}

bool VirtualPlan::mark_needed(const Bindings& b, std::vector<bool>& keep) const {
  const std::uint64_t G = fam->granule;
  std::vector<bool> mine;
  auto mark = [&](std::uint64_t off, std::uint64_t len) {
    if (len == 0) return;
    const std::uint64_t g1 = (off + len - 1) / G + 1;
    if (mine.size() < g1) mine.resize(g1, false);
    for (std::uint64_t g = off / G; g < g1; ++g) mine[g] = true;
  };
  try {
    for (auto [off, len] : gaps) mark(va_start + off, len);
    for (const VirtualItem& it : items) {
      if (it.bytes) mark(it.offset, 1);
      mark(it.offset + it.bytes, it.extra);
      switch (it.kind) {
        case VirtualItem::Kind::fixed: mark(it.offset, it.fixed_bytes); break;
        case VirtualItem::Kind::prefix:
          mark(it.offset, std::min<std::uint64_t>(it.bytes, mul_bytes(it.length->evaluate(b), it.element_bytes, it.name)));
          break;
        case VirtualItem::Kind::per_request: {
          const auto v = b.values(*it.batch);
          if (v.size() != it.count) return false;  // bindings of another batch size: keep nothing for it
          ElementEval ev(b);
          for (std::size_t i = 0; i < v.size(); ++i)
            for (const auto& r : it.ranges) {
              const auto len = ev.at(r, *it.elem, v[i]);
              if (!len || *len <= 0) continue;
              const std::uint64_t start = it.offset + i * it.stride_bytes + r.offset_bytes;
              const std::uint64_t end = std::min(start + mul_bytes(*len, it.element_bytes, it.name), it.offset + it.bytes);
              if (end > start) mark(start, end - start);
            }
          break;
        }
      }
    }
  } catch (const error&) {
    return false;  // the bindings do not fit this graph (unbound symbol, ...): keep nothing for it
  }
  if (keep.size() < mine.size()) keep.resize(mine.size(), false);
  for (std::size_t i = 0; i < mine.size(); ++i)
    if (mine[i]) keep[i] = true;
  return true;
}

void VirtualPlan::need_of(const Bindings& b, std::uint64_t& exact, std::uint64_t& granules,
                          std::uint64_t& ranges) const {
  exact = 0;
  ranges = 0;
  std::vector<std::uint64_t> gs;
  const std::uint64_t G = fam->granule;
  auto add = [&](std::uint64_t off, std::uint64_t len) {
    if (len == 0) return;
    exact += len;
    ++ranges;
    for (std::uint64_t g = off / G; g <= (off + len - 1) / G; ++g) gs.push_back(g);
  };
  for (const VirtualItem& it : items) {
    switch (it.kind) {
      case VirtualItem::Kind::fixed: add(it.offset, it.fixed_bytes); break;
      case VirtualItem::Kind::prefix: add(it.offset, mul_bytes(it.length->evaluate(b), it.element_bytes, it.name)); break;
      case VirtualItem::Kind::per_request: {
        const auto v = b.values(*it.batch);
        ElementEval ev(b);
        for (std::size_t i = 0; i < v.size(); ++i)
          for (const auto& r : it.ranges) {
            const auto len = ev.at(r, *it.elem, v[i]);
            if (len && *len > 0)
              add(it.offset + i * it.stride_bytes + r.offset_bytes, mul_bytes(*len, it.element_bytes, it.name));
          }
        break;
      }
    }
  }
  std::sort(gs.begin(), gs.end());
  granules = static_cast<std::uint64_t>(std::unique(gs.begin(), gs.end()) - gs.begin()) * G;
}

// ---- arena hooks ---------------------------------------------------------------------------------

void virtual_begin_session(ArenaCore& core, SessionState& st) {
  Family& f = *st.family;
  {
    std::lock_guard g(core.lock);
    if (f.capturing)
      throw capture_state_error("graphsafe: family '" + f.name +
                                "' is already capturing a graph; capture the graphs of one family one after another");
    f.capturing = true;
    if (!core.virt) core.virt = std::make_shared<VirtualRegistry>();
  }
  try {
    if (!f.virt) {
      auto vf = std::make_shared<VirtualFamily>();
      vf->vm = core.opts.virtual_memory;
      vf->core = core.weak_from_this();
      vf->name = f.name;
      vf->granule = vf->vm->granularity();
      // Address space is cheap but not unlimited: halve down to 1 GiB when the reservation fails.
      std::uint64_t want = std::max<std::uint64_t>(core.opts.virtual_reserve_bytes, vf->granule);
      for (;;) {
        try {
          vf->base = vf->vm->reserve(want);
          vf->va_bytes = (want + vf->granule - 1) / vf->granule * vf->granule;
          break;
        } catch (const out_of_memory_error&) {
          if (want <= (1ull << 30)) throw;
          want /= 2;
        }
      }
      if (core.observer) {
        std::lock_guard g(core.lock);
        core.observer->slab_added(vf->base, vf->va_bytes, /*heap=*/false);
      }
      f.virt = std::move(vf);
      std::lock_guard g(core.virt->m);
      core.virt->families.push_back(st.family);
    }
  } catch (...) {
    std::lock_guard g(core.lock);
    f.capturing = false;
    throw;
  }
  st.virt = std::make_shared<VirtualPlan>();
  st.virt->fam = f.virt;
  if (core.opts.virtual_sharing == VirtualSharing::disjoint_lifetimes) {
    // The capture's ranges follow the family's earlier ones: a granule shows one slot.
    std::lock_guard g(f.virt->m);
    st.virt->shared = true;
    st.virt->va_start = f.virt->va_next;
  }
  st.base = f.virt->base + st.virt->va_start;
  st.limit = f.virt->va_bytes - st.virt->va_start;
  st.bump = 0;
}

void virtual_end_session(ArenaCore& core, SessionState& st, bool success) {
  Family& f = *st.family;
  const std::uint64_t used = align_up(st.bump, kAlignment);
  {
    std::lock_guard g(core.lock);
    f.capturing = false;
    if (success) {
      f.largest_plan = std::max(f.largest_plan, used);
      f.sum_plans += used;
    }
  }
  VirtualPlan& p = *st.virt;
  VirtualFamily& vf = *p.fam;
  std::lock_guard g(vf.m);
  if (!success) {
    // Nothing of this capture survives; with no graph left, nothing of the family does either.
    std::uint64_t graphs;
    {
      std::lock_guard lk(core.lock);
      graphs = f.graphs;
    }
    if (graphs == 0) {
      try {
        vf.unmap_except({});
      } catch (...) {
      }
      vf.forget_slots(0);
      vf.va_next = 0;
    } else if (p.shared) {
      // Its own range (after the family's other graphs' ranges): unmapped, its slots forgotten.
      const std::uint64_t first = p.va_start / vf.granule;
      try {
        vf.unmap_except(std::vector<bool>(first, true));
      } catch (...) {
      }
      vf.forget_slots(first);
    }
    return;
  }
  if (p.shared) vf.va_next = align_up(p.va_start + used, vf.granule);
  if (used > p.placed_to) p.gaps.emplace_back(p.placed_to, used - p.placed_to);
  try {
    for (auto [off, len] : p.gaps) vf.commit(p.va_start + off, len);
  } catch (...) {
    // The first replay commits everything again (and refuses to launch if it still cannot).
  }
  p.epoch = 0;  // thresholds are computed by the first replay, for its bindings
  vf.plans.push_back(&p);
  p.registered = true;
}

std::uint64_t virtual_align(SessionState& st, std::uint64_t offset, std::uint64_t bytes) {
  VirtualPlan& p = *st.virt;
  const std::uint64_t G = p.fam->granule;
  const std::uint64_t in = offset % G;
  const std::uint64_t at = in == 0 || in + bytes <= G ? offset : offset - in + G;
  // Alignment padding (to 256 bytes or to the granule) is nobody's: not a gap to map -- mapping it
  // would map the last granule of the workspace before it, whatever that one's need. (Bytes placed
  // by someone the virtual hooks did not see would still be gaps: placed_to < bump.)
  if (p.placed_to >= st.bump) p.placed_to = std::max(p.placed_to, at);
  return at;
}

bool virtual_shares(const SessionState& st) { return st.virt && st.virt->shared; }

std::uint64_t virtual_share_place(SessionState& st, std::uint64_t phys, std::uint64_t bytes) {
  VirtualPlan& p = *st.virt;
  const std::uint64_t G = p.fam->granule;
  // st.base is granule-aligned: a granule of its own, at phys's offset inside its granule.
  const std::uint64_t at = align_up(st.bump, G) + phys % G;
  if (p.placed_to >= st.bump) p.placed_to = std::max(p.placed_to, at);  // padding is nobody's gap
  if (bytes) {
    std::lock_guard g(p.phys_m);
    p.phys_at.emplace_back(at, phys);
  }
  return at;
}

std::uint64_t virtual_planner_offset(SessionState& st, std::uint64_t va) {
  if (!virtual_shares(st)) return va;
  VirtualPlan& p = *st.virt;
  std::lock_guard g(p.phys_m);
  for (auto [at, phys] : p.phys_at)
    if (at == va) return phys;
  return ~std::uint64_t(0);  // no block of this capture starts there
}

namespace {
// Sharing: the granules of `it` show the physical slots of its bytes (fam.m held).
void assign_slots(SessionState& st, VirtualFamily& f, VirtualItem& it) {
  VirtualPlan& p = *st.virt;
  const std::uint64_t len = it.bytes + it.extra;
  if (!p.shared || len == 0) return;
  const std::uint64_t va = it.offset - p.va_start;
  {
    std::lock_guard g(p.phys_m);
    auto at = std::find_if(p.phys_at.rbegin(), p.phys_at.rend(), [&](const auto& e) { return e.first == va; });
    if (at == p.phys_at.rend()) return;  // not placed by the planner (cannot happen): a chunk of its own
    it.phys = at->second;
  }
  const std::uint64_t G = f.granule;
  const std::uint64_t g0 = it.offset / G, g1 = (it.offset + len - 1) / G + 1, s0 = it.phys / G;
  if (f.slot_of.size() < g1) f.slot_of.resize(g1, 0);
  const std::uint64_t slots = s0 + (g1 - g0);
  if (f.slot_chunk.size() < slots) {
    f.slot_chunk.resize(slots, 0);
    f.slot_maps.resize(slots, 0);
  }
  for (std::uint64_t g = g0; g < g1; ++g)
    if (g >= f.chunk.size() || !f.chunk[g]) f.slot_of[g] = s0 + (g - g0) + 1;
}

VirtualItem& new_item(SessionState& st, std::uint64_t offset, std::uint64_t bytes, std::uint64_t extra,
                      std::uint64_t element_bytes, std::string_view name) {
  VirtualPlan& p = *st.virt;
  if (offset > p.placed_to) p.gaps.emplace_back(p.placed_to, offset - p.placed_to);  // placed by others
  p.placed_to = std::max(p.placed_to, offset + bytes + extra);
  VirtualItem& it = p.items.emplace_back();
  it.name = std::string(name);
  it.offset = p.va_start + offset;
  it.bytes = bytes;
  it.extra = extra;
  it.element_bytes = element_bytes;
  return it;
}
}  // namespace

void virtual_place(SessionState& st, std::uint64_t offset, std::uint64_t bytes, std::uint64_t extra,
                   std::uint64_t element_bytes, const Extent& need, const Footprint* touched, const Bindings& b,
                   std::string_view name) {
  VirtualPlan& p = *st.virt;
  VirtualItem& it = new_item(st, offset, bytes, extra, element_bytes, name);
  const Footprint::Kind k = touched ? touched->kind() : Footprint::Kind::whole;
  if (k == Footprint::Kind::per_request) {
    it.kind = VirtualItem::Kind::per_request;
    it.batch = touched->batch();
    it.elem = touched->element_symbol();
    it.stride_bytes = mul_bytes(touched->stride()->evaluate(b), element_bytes, it.name);
    it.count = b.values(*it.batch).size();
    for (const FootprintRange& r : touched->ranges())
      it.ranges.push_back({mul_bytes(r.offset.evaluate(b), element_bytes, it.name), r.length});
    auto gate = std::find_if(p.gates.begin(), p.gates.end(), [&](const VirtualGate& g) { return g.batch == *it.batch; });
    if (gate == p.gates.end()) gate = p.gates.insert(p.gates.end(), VirtualGate{*it.batch, {}, {}});
    gate->items.push_back(p.items.size() - 1);
  } else {
    const Extent len = k == Footprint::Kind::prefix ? *touched->length() : need;
    if (len.is_static()) {
      it.kind = VirtualItem::Kind::fixed;
      it.fixed_bytes = std::min(bytes, mul_bytes(len.evaluate(b), element_bytes, it.name));
    } else {
      it.kind = VirtualItem::Kind::prefix;
      it.length = len;
      it.mono = len.monotone();
      for (Symbol s : len.dynamic_symbols())
        (s.kind() == SymbolKind::batch ? it.mono_batch : it.mono_scalar).push_back(s);
      p.prefix_items.push_back(p.items.size() - 1);
    }
  }
  // The capture-time need is mapped now (driver calls in relaxed capture mode: not in the graph).
  VirtualFamily& f = *p.fam;
  std::lock_guard g(f.m);
  VirtualMemory::CaptureTimeMaps during_capture;  // listeners defer what is not capture-safe
  for (auto [off, len] : p.gaps) f.commit(p.va_start + off, len);
  assign_slots(st, f, it);
  commit_item(f, it, b);
}

void virtual_place_bytes(SessionState& st, std::uint64_t offset, std::uint64_t bytes, std::string_view name) {
  VirtualPlan& p = *st.virt;
  VirtualItem& it = new_item(st, offset, bytes, 0, 1, name);
  it.kind = VirtualItem::Kind::fixed;
  it.fixed_bytes = bytes;
  VirtualFamily& f = *p.fam;
  std::lock_guard g(f.m);
  VirtualMemory::CaptureTimeMaps during_capture;
  for (auto [off, len] : p.gaps) f.commit(p.va_start + off, len);
  assign_slots(st, f, it);
  commit_item(f, it, Bindings());
}

void virtual_graph_destroyed(ArenaCore& core, Family& f) noexcept {
  if (!f.virt) return;
  VirtualFamily& vf = *f.virt;
  std::lock_guard g(vf.m);
  bool idle;
  {
    std::lock_guard lk(core.lock);
    idle = f.graphs == 0 && !f.capturing;
  }
  // The family's last graph is gone (its replays were synchronized): its chunks go back to the pool.
  if (idle) {
    try {
      vf.unmap_except({});
    } catch (...) {
    }
    vf.forget_slots(0);  // the next capture's ranges start at the family's base again
    vf.va_next = 0;
  }
}

}  // namespace detail

// ---- public API ----------------------------------------------------------------------------------

Workspace Arena::request(Stream s, std::string_view name, const Extent& need, std::uint64_t element_bytes,
                         const SizingPolicy& policy, const Bindings& b, const Footprint& touched,
                         std::source_location loc) {
  return core_->request(s, name, need, element_bytes, policy, b, loc, &touched);
}

namespace {
void shrink_impl(detail::ArenaCore& core, Stream s, const Bindings* keep_for) {
  if (core.backend.capture_info(s).active)
    throw capture_state_error("graphsafe: shrink() on a capturing stream; shrink outside capture");
  if (!core.virt) return;
  std::vector<std::shared_ptr<detail::Family>> fams;
  {
    std::lock_guard g(core.virt->m);
    auto& v = core.virt->families;
    v.erase(std::remove_if(v.begin(), v.end(), [](const auto& w) { return w.expired(); }), v.end());
    for (auto& w : v)
      if (auto f = w.lock()) fams.push_back(std::move(f));
  }
  for (auto& f : fams) {
    void* last;
    {
      std::lock_guard g(core.lock);
      if (f->capturing)
        throw capture_state_error("graphsafe: shrink() while family '" + f->name +
                                  "' is capturing; shrink between captures");
      last = f->last_stream;
    }
    // No replay may be in flight when memory is unmapped.
    core.backend.synchronize(s);
    if (last && last != detail::stream_tag(s)) core.backend.synchronize(detail::tagged_stream(last));
    if (!f->virt) continue;
    detail::VirtualFamily& vf = *f->virt;
    std::lock_guard g(vf.m);
    std::vector<bool> keep;
    if (keep_for)
      for (const detail::VirtualPlan* p : vf.plans) p->mark_needed(*keep_for, keep);
    vf.unmap_except(keep);
  }
}
}  // namespace

void Arena::shrink(Stream s) { shrink_impl(*core_, s, nullptr); }
void Arena::shrink(Stream s, const Bindings& keep_for) { shrink_impl(*core_, s, &keep_for); }

std::uint64_t Arena::committed_bytes() const {
  if (!core_->virt) return 0;
  std::uint64_t total = 0;
  std::lock_guard g(core_->virt->m);
  for (auto& w : core_->virt->families)
    if (auto f = w.lock(); f && f->virt) {
      std::lock_guard lk(f->virt->m);
      total += f->virt->physical * f->virt->granule;
    }
  return total;
}

namespace {
detail::GraphState& live_graph(const std::unique_ptr<detail::GraphState>& s) {
  if (!s || (!s->handle.exec && !s->handle.graph))
    throw capture_state_error("graphsafe: use of a graph that was moved from or destroyed");
  return *s;
}
}  // namespace

void CapturedGraph::commit(const Bindings& b) {
  detail::GraphState& g = live_graph(state_);
  if (g.virt) detail::virtual_commit(*g.virt, b);
}

VirtualGraphStats CapturedGraph::virtual_stats(const Bindings* b) const {
  const detail::GraphState& g = live_graph(state_);
  VirtualGraphStats st;
  st.reserved_bytes = g.plan.bytes();
  if (!g.virt) return st;
  const detail::VirtualPlan& p = *g.virt;
  st.virtual_mode = true;
  st.va_bytes = p.fam->va_bytes;
  st.granularity = p.fam->granule;
  {
    std::lock_guard lk(p.fam->m);
    st.committed_bytes = p.fam->physical * p.fam->granule;
    st.mapped_bytes = p.fam->mapped * p.fam->granule;
  }
  st.workspaces = p.items.size();
  st.fast_commits = p.fast;
  st.slow_commits = p.slow;
  st.grow_events = p.grew;
  if (b) p.need_of(*b, st.exact_need_bytes, st.granule_need_bytes, st.touched_ranges);
  return st;
}

}  // namespace graphsafe
