// A backend that forwards every call to a HostBackend. Tests derive from it and override the one
// call they instrument (count it, fail it, act after it), keeping the host's semantics for the rest.
#pragma once

#include <graphsafe/host_backend.hpp>

namespace graphsafe_test {

class ForwardingBackend : public graphsafe::Backend {
 public:
  using Stream = graphsafe::Stream;
  explicit ForwardingBackend(graphsafe::HostBackendOptions o = {}) : host(o) {}
  std::string_view name() const override { return "host"; }
  void* allocate_slab(std::uint64_t bytes, Stream s) override { return host.allocate_slab(bytes, s); }
  void free_slab(void* p, std::uint64_t bytes, Stream s) override { host.free_slab(p, bytes, s); }
  graphsafe::CaptureInfo capture_info(Stream s) const override { return host.capture_info(s); }
  void begin_capture(Stream s, graphsafe::CaptureMode m) override { host.begin_capture(s, m); }
  graphsafe::GraphHandle end_capture(Stream s) override { return host.end_capture(s); }
  void abort_capture(Stream s) noexcept override { host.abort_capture(s); }
  void launch(const graphsafe::GraphHandle& g, Stream s) override { host.launch(g, s); }
  void destroy(graphsafe::GraphHandle& g) noexcept override { host.destroy(g); }
  void order_after(Stream waiter, Stream producer) override { host.order_after(waiter, producer); }
  void synchronize(Stream s) override { host.synchronize(s); }
  void fill_bytes(void* p, std::uint64_t bytes, std::uint8_t v, Stream s) override { host.fill_bytes(p, bytes, v, s); }
  void copy_to_host(void* dst, const void* src, std::uint64_t bytes, Stream s) override {
    host.copy_to_host(dst, src, bytes, s);
  }

  graphsafe::HostBackend host;
};

}  // namespace graphsafe_test
