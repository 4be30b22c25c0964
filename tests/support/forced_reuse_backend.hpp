// A backend that forwards every call to another one but, when `force` is set, answers that any
// released range is ordered before any stream's next work. The planner then reuses ranges across
// streams the graph never joined: the unsafe reuse the graph audit exists to catch.
#pragma once

#include <graphsafe/backend.hpp>

namespace graphsafe_test {

class ForcedReuseBackend : public graphsafe::Backend {
 public:
  using Stream = graphsafe::Stream;
  explicit ForcedReuseBackend(graphsafe::Backend& inner) : inner_(inner) {}
  bool force = true;

  bool capture_ordered_after(Stream s, const std::vector<const void*>& before) const override {
    return force || inner_.capture_ordered_after(s, before);
  }

  std::string_view name() const override { return inner_.name(); }
  bool nvtx_heaps_supported() const override { return inner_.nvtx_heaps_supported(); }
  void* allocate_slab(std::uint64_t bytes, Stream s) override { return inner_.allocate_slab(bytes, s); }
  void free_slab(void* p, std::uint64_t bytes, Stream s) override { inner_.free_slab(p, bytes, s); }
  graphsafe::CaptureInfo capture_info(Stream s) const override { return inner_.capture_info(s); }
  void begin_capture(Stream s, graphsafe::CaptureMode m) override { inner_.begin_capture(s, m); }
  graphsafe::GraphHandle end_capture(Stream s) override { return inner_.end_capture(s); }
  void abort_capture(Stream s) noexcept override { inner_.abort_capture(s); }
  bool capture_dependencies(Stream s, std::vector<const void*>& out) const override {
    return inner_.capture_dependencies(s, out);
  }
  bool graph_topology(const graphsafe::GraphHandle& g, graphsafe::GraphTopology& out) const override {
    return inner_.graph_topology(g, out);
  }
  void launch(const graphsafe::GraphHandle& g, Stream s) override { inner_.launch(g, s); }
  void destroy(graphsafe::GraphHandle& g) noexcept override { inner_.destroy(g); }
  void order_after(Stream waiter, Stream producer) override { inner_.order_after(waiter, producer); }
  void synchronize(Stream s) override { inner_.synchronize(s); }
  void fill_bytes(void* p, std::uint64_t bytes, std::uint8_t v, Stream s) override { inner_.fill_bytes(p, bytes, v, s); }
  void copy_to_host(void* dst, const void* src, std::uint64_t bytes, Stream s) override {
    inner_.copy_to_host(dst, src, bytes, s);
  }

 private:
  graphsafe::Backend& inner_;
};

}  // namespace graphsafe_test
