// Tensor-parallel ranks check that their captures laid out the same offsets (host backend; each
// rank is a thread with an arena of its own, the all-gather an in-process stand-in for NCCL).
#include <graphsafe/graphsafe.hpp>

#include <algorithm>
#include <barrier>
#include <cstdint>
#include <cstdio>
#include <span>
#include <thread>
#include <vector>

using namespace graphsafe;

// The one collective the check needs: every rank sends `mine` (the same length on every rank) and
// gets every rank's words, rank-major -- ncclAllGather(send, recv, n, ncclUint64, comm, stream),
// MPI_Allgather(..., MPI_UINT64_T, ...) or torch.distributed.all_gather_into_tensor.
struct Communicator {
  virtual ~Communicator() = default;
  virtual int size() const = 0;
  virtual std::vector<std::uint64_t> all_gather(std::span<const std::uint64_t> mine) = 0;
};

// Call on every rank after capturing: returns on all ranks, or throws layout_mismatch_error on all
// ranks (each takes the same branches: they decide on gathered values only).
void check_rank_layouts(const Plan& plan, Communicator& comm) {
  const PlanLayout mine = plan.layout();
  // 1. One word per rank: equal digests end it, the usual case.
  const std::uint64_t digest = mine.digest();
  const auto digests = comm.all_gather({&digest, 1});
  if (std::all_of(digests.begin(), digests.end(), [&](std::uint64_t d) { return d == digests[0]; })) return;
  // 2. They differ: gather the layouts, padded to the longest, and name the first difference.
  std::vector<std::uint64_t> words = mine.serialize();
  const std::uint64_t length = words.size();
  const auto lengths = comm.all_gather({&length, 1});
  const std::uint64_t stride = *std::max_element(lengths.begin(), lengths.end());
  words.resize(stride, 0);  // deserialize ignores the padding
  const auto all = comm.all_gather(words);
  std::vector<PlanLayout> layouts;
  for (int r = 0; r < comm.size(); ++r)
    layouts.push_back(PlanLayout::deserialize(std::span(all).subspan(r * stride, stride)));
  check_identical_layouts(layouts);  // names the rank, the request, its offset and bytes on both
}

// In-process ranks: threads meeting at a barrier.
class ThreadComm {
 public:
  explicit ThreadComm(int ranks) : slots_(ranks), barrier_(ranks) {}
  struct Rank : Communicator {
    ThreadComm* c;
    int rank;
    Rank(ThreadComm* comm, int r) : c(comm), rank(r) {}
    int size() const override { return static_cast<int>(c->slots_.size()); }
    std::vector<std::uint64_t> all_gather(std::span<const std::uint64_t> mine) override {
      c->slots_[rank].assign(mine.begin(), mine.end());
      c->barrier_.arrive_and_wait();
      std::vector<std::uint64_t> out;
      for (const auto& s : c->slots_) out.insert(out.end(), s.begin(), s.end());
      c->barrier_.arrive_and_wait();  // nobody refills a slot before every rank has read it
      return out;
    }
  };

 private:
  std::vector<std::vector<std::uint64_t>> slots_;
  std::barrier<> barrier_;
};

// Every rank captures its step (the same code), then checks; returns what rank 0 saw.
bool run_ranks(int ranks, std::int64_t (*rows_on)(int rank)) {
  ThreadComm comm(ranks);
  std::vector<int> caught(ranks, 0);
  std::vector<std::thread> threads;
  for (int r = 0; r < ranks; ++r)
    threads.emplace_back([&, r] {
      HostBackend backend;
      ArenaOptions options;
      options.report_findings = false;
      Arena arena(backend, options);
      HostStream s;
      arena.reserve(1 << 20, s);
      Bindings b;
      CapturedGraph graph = capture(arena, s, b, [&](const Bindings& bb) {
        auto qkv = arena.request(s, "attn.qkv", Extent(rows_on(r)), 1024, capacity_bound, bb);
        auto out = arena.request(s, "attn.out", Extent(64), 1024, capacity_bound, bb);
        s.launch([] { /* kernels and collectives on qkv and out */ });
      });
      ThreadComm::Rank me(&comm, r);
      try {
        check_rank_layouts(graph.plan(), me);
      } catch (const layout_mismatch_error& e) {
        caught[r] = 1;
        if (r == 0) std::printf("%s\n", e.what());
      }
    });
  for (auto& t : threads) t.join();
  return caught[0] != 0;
}

int main() {
  // The same capture everywhere: the check passes on every rank.
  const bool same = run_ranks(4, [](int) -> std::int64_t { return 128; });
  std::printf("same capture on 4 ranks: %s\n", same ? "mismatch" : "identical layouts");
  // A rank-dependent size (a shard rounded differently on rank 3) moves rank 3's later offsets.
  const bool differ = run_ranks(4, [](int r) -> std::int64_t { return r == 3 ? 160 : 128; });
  return !same && differ ? 0 : 1;
}
