// Debug mode on the host backend (runs in CI): capture findings (unbounded dynamic sizes, opaque
// requests), probe capture on the seed's step vs its safe twin, concurrent family replays,
// canaries naming workspace / graph / replay, audit_replay on the seed's regression, the JSON report,
// eager workspaces released while a graph still uses them by pointer.
#include <catch2/catch.hpp>

#include <graphsafe/debug.hpp>
#include <graphsafe/graphsafe.hpp>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "../support/seed_model.hpp"

using namespace graphsafe;
using namespace graphsafe_test::seed;

namespace {

// The seed's step on the host backend: gather into ws[b*M + ...] with N and M frozen, lengths read
// at run time from `lens` (the "device buffer"), then "attention" into out[b*kOutW + ...].
void decode_step(HostStream& s, std::int64_t* ws, std::int64_t N, std::int64_t M, const std::vector<int>& lens,
                 std::int64_t* out) {
  s.launch([=, &lens] {
    for (int b = 0; b < static_cast<int>(lens.size()); ++b) {
      const int L = lens[b], n_c = L / kRatio, gb = std::min(L, kWindow);
      for (int c = 0; c < n_c; ++c) ws[b * M + c] = cmp_value(b, c);
      for (int i = 0; i < gb; ++i) ws[b * M + N + i] = swa_value(b, L - gb + i);
    }
  });
  s.launch([=, &lens] {
    for (int b = 0; b < static_cast<int>(lens.size()); ++b) {
      const int L = lens[b], n_c = L / kRatio, gb = std::min(L, kWindow);
      for (int c = 0; c < n_c; ++c) out[b * kOutW + c] = ws[b * M + c];
      for (int i = 0; i < gb; ++i) out[b * kOutW + n_c + i] = ws[b * M + N + i];
    }
  });
}

struct Step {
  Arena& arena;
  HostStream& s;
  const Model& m;
  const SizingPolicy& compressed;
  const SizingPolicy& swa;
  std::vector<int>& lens;
  std::int64_t* out;
  void operator()(const Bindings& b) const {
    const std::int64_t N = arena.dimension(s, "kv.compressed_rows", m.n_c, compressed, b);
    const std::int64_t G = arena.dimension(s, "kv.swa_rows", m.g, swa, b);
    auto ws = arena.request(s, "kv", Extent(m.R) * (N + G), sizeof(std::int64_t), capacity_bound, b);
    decode_step(s, ws.as<std::int64_t>(), N, N + G, lens, out);
  }
};

ArenaOptions debug_options() {
  ArenaOptions o;
  o.debug = true;
  return o;
}

// What most tests here start from: findings cleared, a debug-mode arena on the host backend with
// 1 MiB reserved, the seed's model at lengths [3, 5] and its output buffer; step(n, g) is the seed's
// decode step with those sizing policies for the compressed and SWA rows.
struct SeedDebugArena {
  SeedDebugArena() {
    debug::clear_findings();
    arena.reserve(1 << 20, s);
  }
  Step step(const SizingPolicy& compressed, const SizingPolicy& swa) {
    return Step{arena, s, m, compressed, swa, lens, out.data()};
  }
  Model m;
  HostBackend backend;
  Arena arena{backend, debug_options()};
  HostStream s;
  std::vector<int> lens = {3, 5};
  std::vector<std::int64_t> out = std::vector<std::int64_t>(2 * kOutW);
};

std::vector<debug::Finding> of_kind(const std::vector<debug::Finding>& fs, std::string_view kind) {
  std::vector<debug::Finding> out;
  for (const auto& f : fs)
    if (f.kind == kind) out.push_back(f);
  return out;
}

// Minimal JSON well-formedness: balanced {} [] outside strings, valid escapes, nothing after the end.
bool json_well_formed(const std::string& j) {
  std::vector<char> stack;
  bool in_str = false;
  for (std::size_t i = 0; i < j.size(); ++i) {
    const char c = j[i];
    if (in_str) {
      if (c == '\\') {
        if (i + 1 >= j.size() || std::string("\"\\/bfnrtu").find(j[i + 1]) == std::string::npos) return false;
        ++i;
      } else if (c == '"') {
        in_str = false;
      } else if (static_cast<unsigned char>(c) < 0x20) {
        return false;
      }
      continue;
    }
    if (c == '"') in_str = true;
    else if (c == '{' || c == '[') stack.push_back(c);
    else if (c == '}' || c == ']') {
      if (stack.empty() || stack.back() != (c == '}' ? '{' : '[')) return false;
      stack.pop_back();
      if (stack.empty()) return j.find_first_not_of(" \n\r\t", i + 1) == std::string::npos;
    }
  }
  return false;
}

}  // namespace

// External linkage, never inlined: the release site a finding names (the test links with -rdynamic).
__attribute__((noinline)) void release_block_table(Workspace& w) {
  w.reset();
  asm volatile("" ::: "memory");  // not a tail call: this frame stays on the stack
}

TEST_CASE("debug: ArenaOptions::debug turns on always_check_capture", "[debug]") {
  HostBackend backend;
  Arena on(backend, debug_options());
  CHECK(on.options().debug);
  CHECK(on.options().always_check_capture);
  ArenaOptions off;
  off.debug = false;
  Arena plain(backend, off);
  CHECK_FALSE(plain.options().always_check_capture);
}

TEST_CASE("debug: GRAPHSAFE_DEBUG turns debug mode on when the arena is made, whatever its options say", "[debug]") {
  const char* had = std::getenv("GRAPHSAFE_DEBUG");
  const std::string saved = had ? had : "";
  HostBackend backend;
  ArenaOptions off;
  off.debug = false;
  // Values that leave it off, then values that turn it on (any case).
  for (const char* v : {"", "0", "false", "OFF", "no"}) {
    ::setenv("GRAPHSAFE_DEBUG", v, 1);
    CHECK_FALSE(debug::env_enabled());
    Arena a(backend, off);
    CHECK_FALSE(a.options().debug);
    CHECK_FALSE(a.options().always_check_capture);
  }
  for (const char* v : {"1", "yes", "True"}) {
    ::setenv("GRAPHSAFE_DEBUG", v, 1);
    CHECK(debug::env_enabled());
    Arena a(backend, off);
    CHECK(a.options().debug);
    CHECK(a.options().always_check_capture);  // what debug mode turns on
  }
  // The option struct itself never reads it: a default-made one is off while the variable is on.
  CHECK_FALSE(ArenaOptions{}.debug);
  if (had)
    ::setenv("GRAPHSAFE_DEBUG", saved.c_str(), 1);
  else
    ::unsetenv("GRAPHSAFE_DEBUG");
}

TEST_CASE_METHOD(SeedDebugArena, "debug: unbounded dynamic sizes and opaque requests in capture are reported with their sites", "[debug]") {
  const Bindings b = m.bind(lens);
  auto graph = capture(arena, s, b, [&](const Bindings& bb) {
    step(exact_at_capture, exact_at_capture)(bb);
    void* tmp = arena.allocate(s, 4096);  // a library temporary with only a size_t
    arena.deallocate(s, tmp, 4096);
  });
  const auto fs = debug::findings();
  const auto unbounded = of_kind(fs, debug::kind::unbounded_dynamic_size);
  REQUIRE(unbounded.size() == 2);
  CHECK(unbounded[0].request == "kv.compressed_rows");
  CHECK(unbounded[1].request == "kv.swa_rows");
  CHECK_THAT(unbounded[0].message, Catch::Contains("seq_lens = [3, 5]"));  // symbol and capture-time value
  CHECK_THAT(unbounded[0].site, Catch::Contains("test_debug_mode.cpp"));
  CHECK_THAT(unbounded[0].fix, Catch::Contains("capacity_bound"));
  CHECK_THAT(unbounded[0].graph, Catch::Contains("graph"));
  const auto opaque = of_kind(fs, debug::kind::opaque_request_in_capture);
  REQUIRE(opaque.size() == 1);
  CHECK_THAT(opaque[0].message, Catch::Contains("4096 bytes"));
  CHECK_THAT(opaque[0].site, Catch::Contains("test_debug_mode.cpp"));
  // Plan findings are unchanged by debug mode.
  CHECK(graph.plan().findings().size() == 2);

  SECTION("a safe capture makes no findings") {
    debug::clear_findings();
    auto safe = capture(arena, s, b, [&](const Bindings& bb) {
      step(capacity_bound, capacity_bound)(bb);
    });
    CHECK(debug::findings().empty());
  }
}

TEST_CASE("debug: off, nothing is reported and no guard bytes are added", "[debug]") {
  debug::clear_findings();
  Model m;
  HostBackend backend;
  ArenaOptions off;
  off.debug = false;
  off.report_findings = false;
  Arena arena(backend, off);
  Arena dbg(backend, debug_options());
  HostStream s;
  arena.reserve(1 << 20, s);
  dbg.reserve(1 << 20, s);
  std::vector<int> lens = {3, 5};
  std::vector<std::int64_t> out(2 * kOutW);
  auto g_off = capture(arena, s, m.bind(lens), [&](const Bindings& bb) {
    Step{arena, s, m, exact_at_capture, exact_at_capture, lens, out.data()}(bb);
  });
  CHECK(debug::findings().empty());
  auto g_on = capture(dbg, s, m.bind(lens), [&](const Bindings& bb) {
    Step{dbg, s, m, exact_at_capture, exact_at_capture, lens, out.data()}(bb);
  });
  CHECK(g_off.plan().bytes() == 256);                  // 80-byte workspace, aligned
  CHECK(g_on.plan().bytes() == 512);                   // + 256-byte guard behind it
  CHECK(g_off.plan().entries()[2].offset == g_on.plan().entries()[2].offset);
}

TEST_CASE_METHOD(SeedDebugArena, "debug: probe reports the seed's size and offset dependencies and none for its safe twin", "[debug][probe]") {
  const Bindings a = m.bind({3, 5}), b = m.bind({15, 17});

  const auto diffs = debug::probe(arena, s, step(exact_at_capture, exact_at_capture),
                                  a, b);
  auto find = [&](const std::string& name) {
    return std::count_if(diffs.begin(), diffs.end(), [&](const debug::Finding& f) { return f.request == name; });
  };
  CHECK(find("kv.compressed_rows") == 1);  // N: 1 vs 4
  CHECK(find("kv") == 1);                  // R * (N + G): 10 vs 16 elements
  CHECK(find("kv.swa_rows") == 0);         // min(L, W) = 4 both times
  for (const auto& f : diffs) {
    CHECK(f.kind == debug::kind::probe_difference);
    CHECK_THAT(f.site, Catch::Contains("test_debug_mode.cpp"));
  }
  const auto n = std::find_if(diffs.begin(), diffs.end(), [](const auto& f) { return f.request == "kv.compressed_rows"; });
  REQUIRE(n != diffs.end());
  CHECK_THAT(n->message, Catch::Contains("1 elements") && Catch::Contains("vs 4") &&
                             Catch::Contains("seq_lens = [3, 5]") && Catch::Contains("seq_lens = [15, 17]"));
  CHECK(of_kind(debug::findings(), debug::kind::probe_difference).size() == diffs.size());

  SECTION("safe twin") {
    const StaticQueryBound swa(Extent(m.W));
    const auto none = debug::probe(arena, s, step(capacity_bound, swa), a, b);
    CHECK(none.empty());
  }
  SECTION("plain size_t requests: a size and the offset after it") {
    const auto opaque = debug::probe(
        arena, s,
        [&](const Bindings& bb) {
          std::uint64_t total = 0;
          for (auto v : bb.values(m.L)) total += static_cast<std::uint64_t>(v);
          void* p = arena.allocate(s, total * 64);  // sized from the lengths, in code that only has a size_t
          void* q = arena.allocate(s, 128);
          arena.deallocate(s, q, 128);
          arena.deallocate(s, p, total * 64);
        },
        a, b);
    REQUIRE(opaque.size() == 2);
    CHECK_THAT(opaque[0].message, Catch::Contains("512 bytes") && Catch::Contains("2048"));
    CHECK_THAT(opaque[1].message, Catch::Contains("offset"));
  }
  CHECK(arena.stats().live_graphs == 0);
}

TEST_CASE("debug: graphs of one family replayed on different streams are reported", "[debug][family]") {
  debug::clear_findings();
  Symbol n = Symbol::dynamic("tokens", 1024);
  HostBackend backend;
  Arena arena(backend, debug_options());
  HostStream s1, s2;
  arena.reserve(1 << 20, s1);
  auto fam = arena.family("decode");
  CaptureOptions o;
  o.family = fam;
  auto fn = [&](const Bindings& bb) { auto ws = arena.request(s1, "x", Extent(n) * 2, 4, capacity_bound, bb); };
  auto g1 = capture(arena, s1, Bindings().set(n, 8), fn, o);
  auto g2 = capture(arena, s1, Bindings().set(n, 16), fn, o);
  g1.replay(Bindings().set(n, 8), s1);
  g2.replay(Bindings().set(n, 16), s1);
  CHECK(of_kind(debug::findings(), debug::kind::concurrent_family_replay).empty());
  g2.replay(Bindings().set(n, 16), s2);  // same family, other stream
  const auto c = of_kind(debug::findings(), debug::kind::concurrent_family_replay);
  REQUIRE(c.size() == 1);
  CHECK_THAT(c[0].graph, Catch::Contains("family 'decode'"));
  CHECK_THAT(c[0].site, Catch::Contains("test_debug_mode.cpp"));
  CHECK_THAT(c[0].fix, Catch::Contains("separate families"));
}

TEST_CASE("debug: canaries name the workspace, the graph and the replay that wrote past it", "[debug][canary]") {
  debug::clear_findings();
  Model m;
  HostBackend backend;
  HostStream s;
  std::vector<int> lens = {3, 5};
  std::vector<std::int64_t> out(2 * kOutW);
  for (std::uint32_t every : {1u, 0u}) {
    debug::clear_findings();
    ArenaOptions o = debug_options();
    o.canary_check_every = every;
    Arena arena(backend, o);
    arena.reserve(1 << 20, s);
    CaptureOptions co;
    co.family = arena.family("seed");
    lens = {3, 5};
    auto graph = capture(
        arena, s, m.bind(lens),
        [&](const Bindings& bb) { Step{arena, s, m, exact_at_capture, exact_at_capture, lens, out.data()}(bb); }, co);
    graph.replay(m.bind(lens), s);  // replay #1: within the workspace
    CHECK(of_kind(debug::findings(), debug::kind::canary_overwrite).empty());
    CHECK(debug::check_canaries(graph, s).empty());
    lens = {255, 257};
    graph.replay_unguarded_for_testing(s);  // replay #2: the seed's overflow past 'kv'
    const auto found = debug::check_canaries(graph, s);
    REQUIRE(found.size() == 1);
    CHECK(found[0].kind == debug::kind::canary_overwrite);
    CHECK(found[0].request == "kv");
    CHECK_THAT(found[0].graph, Catch::Contains("family 'seed'"));
    CHECK_THAT(found[0].message, Catch::Contains("replay #2") && Catch::Contains("'kv' (80 bytes)"));
    CHECK_THAT(found[0].site, Catch::Contains("test_debug_mode.cpp"));
    CHECK(of_kind(debug::findings(), debug::kind::canary_overwrite).size() == 1);
    // Re-armed: a clean replay afterwards finds nothing new.
    lens = {3, 5};
    graph.replay(m.bind(lens), s);
    CHECK(debug::check_canaries(graph, s).empty());
  }

  SECTION("eager workspaces are checked when released") {
    debug::clear_findings();
    Arena arena(backend, debug_options());
    {
      auto ws = arena.request(s, "scratch", Extent(10), 8, capacity_bound, Bindings());
      ws.as<std::int64_t>()[10] = 42;  // one element past the end
    }
    const auto e = of_kind(debug::findings(), debug::kind::canary_overwrite);
    REQUIRE(e.size() == 1);
    CHECK(e[0].request == "scratch");
    CHECK(e[0].graph == "eager");
    CHECK_THAT(e[0].message, Catch::Contains("first at +0"));
    CHECK_THAT(e[0].site, Catch::Contains("test_debug_mode.cpp"));
  }
}

TEST_CASE_METHOD(SeedDebugArena, "debug: audit_replay catches the exact-at-capture bug and passes the safe version", "[debug][audit]") {
  const std::vector<Bindings> later = {m.bind({3, 5}), m.bind({15, 17}), m.bind({255, 257}), m.bind({511, 512})};
  debug::AuditOptions ao;
  ao.prepare = [&](const Bindings& b) {
    const auto v = b.values(m.L);
    lens.assign(v.begin(), v.end());
  };
  auto output = [&] { return std::as_bytes(std::span<const std::int64_t>(out)); };

  const StaticQueryBound swa(Extent(m.W));
  const auto safe = debug::audit_replay(arena, s, step(capacity_bound, swa), output,
                                        m.bind({3, 5}), later, ao);
  REQUIRE(safe.size() == later.size());
  for (const auto& st : safe) {
    INFO(st.message);
    CHECK(st.equal);
    CHECK_FALSE(st.refused);
  }
  CHECK(of_kind(debug::findings(), debug::kind::replay_mismatch).empty());

  const auto guarded = debug::audit_replay(arena, s, step(exact_at_capture, exact_at_capture),
                                           output, m.bind({3, 5}), later, ao);
  REQUIRE(guarded.size() == later.size());
  CHECK(guarded[0].equal);
  for (std::size_t i = 1; i < guarded.size(); ++i) {
    CHECK(guarded[i].refused);  // the guard caught it before launch
    CHECK_THAT(guarded[i].message, Catch::Contains("kv.compressed_rows"));
  }
  CHECK(of_kind(debug::findings(), debug::kind::replay_refused).size() == 3);

  ao.bypass_guards = true;
  const auto bypassed = debug::audit_replay(arena, s, step(exact_at_capture, exact_at_capture),
                                            output, m.bind({3, 5}), later, ao);
  CHECK(bypassed[0].equal);
  CHECK_FALSE(bypassed[1].equal);  // the seed's silent corruption: SWA rows over compressed rows
  CHECK(bypassed[1].differing_bytes > 0);
  CHECK_FALSE(bypassed[1].refused);
  CHECK_THAT(bypassed[1].message, Catch::Contains("seq_lens = [15, 17]"));
  CHECK(of_kind(debug::findings(), debug::kind::replay_mismatch).size() >= 1);
}

TEST_CASE_METHOD(SeedDebugArena, "debug: external findings and the JSON report", "[debug][report]") {
  auto graph = capture(arena, s, m.bind(lens), [&](const Bindings& bb) {
    step(exact_at_capture, exact_at_capture)(bb);
    // What the CUPTI injection library does from its callback.
    debug::report_finding("raw-cuda-malloc-in-capture", "engine.cpp:42 (alloc)", "cudaMalloc(1024) during capture",
                          "use the arena", "", "");
    debug::report_finding("raw-cuda-malloc-in-capture", "engine.cpp:42 (alloc)", "cudaMalloc(1024) during capture",
                          "use the arena", "", "");
  });
  const auto ext = of_kind(debug::findings(), "raw-cuda-malloc-in-capture");
  REQUIRE(ext.size() == 1);
  CHECK(ext[0].count == 2);  // identical findings merge

  const std::string path = "graphsafe_debug_report_test.json";
  debug::write_report(path);
  std::ifstream f(path);
  REQUIRE(f);
  std::stringstream ss;
  ss << f.rdbuf();
  const std::string j = ss.str();
  CHECK(json_well_formed(j));
  CHECK_THAT(j, Catch::Contains("\"graphsafe_debug_report\": 1"));
  CHECK_THAT(j, Catch::Contains("\"kind\": \"unbounded-dynamic-size\""));
  CHECK_THAT(j, Catch::Contains("\"kind\": \"raw-cuda-malloc-in-capture\""));
  CHECK_THAT(j, Catch::Contains("\"request\": \"kv.compressed_rows\""));
  CHECK_THAT(j, Catch::Contains("\"count\": 2"));
  CHECK_THAT(j, Catch::Contains("test_debug_mode.cpp:"));
  CHECK(j == debug::report_json());
  CHECK_THAT(debug::report_text(), Catch::Contains("fix: "));
  std::remove(path.c_str());
  CHECK_THROWS_AS(debug::write_report("/nonexistent-dir/x.json"), error);
  // Quotes and control characters are escaped.
  debug::report_finding("x", "a\"b", "line1\nline2\t\x01", "");
  CHECK(json_well_formed(debug::report_json()));
  // ... and read back as written (a JSON parser, not the writer's escaping, decides).
  const auto parsed = nlohmann::json::parse(debug::report_json());
  CHECK(parsed.at("finding_count") == parsed.at("findings").size());
  const auto& last = parsed.at("findings").back();
  CHECK(last.at("kind") == "x");
  CHECK(last.at("site") == "a\"b");
  CHECK(last.at("message") == "line1\nline2\t\x01");
  debug::clear_findings();
}

// The engine pattern: a buffer requested eagerly once, its address captured into a graph, then freed
// (or re-requested at a new size) while the graph lives. Its bytes are served again and every replay
// writes into their new owner.
TEST_CASE_METHOD(SeedDebugArena,
                 "debug: an eager workspace released while a graph uses it by pointer is reported with both sites",
                 "[debug][captured-eager]") {
  auto table = arena.request(s, "block_table", Extent(64), sizeof(int), capacity_bound, Bindings{});
  auto graph = capture(arena, s, Bindings{}, [&](const Bindings&) {
    int* p = table.as<int>();
    debug::captured_pointer(arena, s, p + 3, "block table row 3");  // an interior pointer counts
    s.launch([p] {
      for (int i = 0; i < 64; ++i) p[i] = i;
    });
  });
  graph.replay(Bindings{}, s);
  CHECK(table.as<int>()[63] == 63);  // the graph does write through the captured address
  CHECK(of_kind(debug::findings(), debug::kind::captured_eager_release).empty());

  release_block_table(table);
  const auto f = of_kind(debug::findings(), debug::kind::captured_eager_release);
  REQUIRE(f.size() == 1);
  INFO(f[0].message << " | site: " << f[0].site);
  CHECK(f[0].request == "block_table");
  CHECK_THAT(f[0].graph, Catch::Contains("family 'graph' graph #"));
  // The capture site: the declaration, with its file and line; and the workspace's request site.
  CHECK_THAT(f[0].message, Catch::Contains("pointer 'block table row 3' declared at"));
  CHECK_THAT(f[0].message, Catch::Contains("(256 bytes at 0x"));
  CHECK_THAT(f[0].message, Catch::Contains("requested at"));
  CHECK(std::count(f[0].message.begin(), f[0].message.end(), ':') >= 2);
  CHECK_THAT(f[0].message, Catch::Contains("test_debug_mode.cpp:"));
  // The release site: the function that released it.
  CHECK_THAT(f[0].site, Catch::Contains("release_block_table"));
  CHECK_THAT(f[0].fix, Catch::Contains("inside the capture"));
}

TEST_CASE_METHOD(SeedDebugArena,
                 "debug: an eager workspace released inside the capture that uses it is reported when the graph is made",
                 "[debug][captured-eager]") {
  auto table = arena.request(s, "block_table", Extent(64), sizeof(int), capacity_bound, Bindings{});
  auto graph = capture(arena, s, Bindings{}, [&](const Bindings&) {
    int* p = table.as<int>();
    debug::captured_pointer(arena, s, p, "block table");
    s.launch([p] { p[0] = 1; });
    release_block_table(table);  // "resized" inside the capture: the graph keeps the old address
  });
  const auto f = of_kind(debug::findings(), debug::kind::captured_eager_release);
  REQUIRE(f.size() == 1);
  INFO(f[0].message << " | site: " << f[0].site);
  CHECK(f[0].request == "block_table");
  CHECK_THAT(f[0].message, Catch::Contains("was released during the capture of family 'graph' graph #"));
  CHECK_THAT(f[0].message, Catch::Contains("pointer 'block table' declared at test_debug_mode.cpp:"));
  CHECK_THAT(f[0].site, Catch::Contains("release_block_table"));
  // A later capture with nothing released in it reports nothing more.
  auto again = arena.request(s, "block_table", Extent(64), sizeof(int), capacity_bound, Bindings{});
  auto clean = capture(arena, s, Bindings{}, [&](const Bindings&) {
    int* p = again.as<int>();
    debug::captured_pointer(arena, s, p, "block table");
    s.launch([p] { p[0] = 1; });
  });
  CHECK(of_kind(debug::findings(), debug::kind::captured_eager_release).size() == 1);
}

TEST_CASE_METHOD(SeedDebugArena,
                 "debug: no captured-eager finding for a workspace requested inside the capture, a graph destroyed "
                 "first, or an eager workspace the graph does not use",
                 "[debug][captured-eager]") {
  auto unrelated = arena.request(s, "unrelated", Extent(64), sizeof(int), capacity_bound, Bindings{});
  {
    // The fix: the workspace requested inside the capture belongs to the graph.
    auto graph = capture(arena, s, Bindings{}, [&](const Bindings& b) {
      auto table = arena.request(s, "block_table", Extent(64), sizeof(int), capacity_bound, b);
      int* p = table.as<int>();
      debug::captured_pointer(arena, s, p, "block table");
      s.launch([p] {
        for (int i = 0; i < 64; ++i) p[i] = i;
      });
    });
    graph.replay(Bindings{}, s);
  }
  {
    // An eager workspace captured by pointer, released only after the graph is destroyed.
    auto table = arena.request(s, "block_table", Extent(64), sizeof(int), capacity_bound, Bindings{});
    {
      auto graph = capture(arena, s, Bindings{}, [&](const Bindings&) {
        int* p = table.as<int>();
        debug::captured_pointer(arena, s, p, "block table");
        s.launch([p] { p[0] = 1; });
      });
      graph.replay(Bindings{}, s);
    }
    release_block_table(table);
  }
  {
    // A live graph, and an eager workspace it does not use released.
    auto other = arena.request(s, "other", Extent(64), sizeof(int), capacity_bound, Bindings{});
    auto graph = capture(arena, s, Bindings{}, [&](const Bindings&) {
      int* p = other.as<int>();
      debug::captured_pointer(arena, s, p, "other");
      s.launch([p] { p[0] = 1; });
    });
    release_block_table(unrelated);
    CHECK(of_kind(debug::findings(), debug::kind::captured_eager_release).empty());
    // ...while the one it does use is reported (the checks above could see a release).
    release_block_table(other);
    CHECK(of_kind(debug::findings(), debug::kind::captured_eager_release).size() == 1);
  }
}

TEST_CASE("debug: captured_pointer outside a capture is refused in debug mode and ignored without it",
          "[debug][captured-eager]") {
  HostBackend backend;
  HostStream s;
  int x = 0;
  Arena on(backend, debug_options());
  CHECK_THROWS_AS(debug::captured_pointer(on, s, &x, "x"), capture_state_error);
  try {
    debug::captured_pointer(on, s, &x, "x");
  } catch (const capture_state_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("not capturing") && Catch::Contains("test_debug_mode.cpp:"));
  }
  Arena off(backend);
  CHECK_NOTHROW(debug::captured_pointer(off, s, &x, "x"));
}
