// Symbols: the named host quantities a workspace size is computed from.
//
// A *static* symbol is fixed for a captured graph's life (padded batch, window, head count): its
// captured value is its value. A *dynamic* symbol changes between replays (sequence lengths, number
// of selected rows) and may declare a *capacity* (an upper bound such as max_model_len). A
// *batch* symbol is a dynamic value per request of a batch (seq_lens[b]); its length is a static
// symbol. Symbols are cheap handles (an id into a process-wide registry) and compare by identity.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace graphsafe {

namespace detail {
struct ExtentNode;
}

enum class SymbolKind : std::uint8_t { static_value, dynamic_value, batch };

class Symbol {
 public:
  // Fixed for a graph's life: the capture-time value is the value.
  static Symbol fixed(std::string_view name);
  // Changes between replays; `capacity` (if given) bounds every value it may take.
  static Symbol dynamic(std::string_view name, std::optional<std::int64_t> capacity = std::nullopt);
  // One dynamic value per request of a batch whose size is the static symbol `length`; every
  // element is <= `capacity` (if given).
  static Symbol batch(std::string_view name, Symbol length,
                      std::optional<std::int64_t> capacity = std::nullopt);

  // Handle of an existing symbol from its id (reports, extents); throws for an unknown id.
  static Symbol from_id(std::uint32_t id);

  std::uint32_t id() const noexcept { return id_; }
  const std::string& name() const;
  SymbolKind kind() const;
  bool is_dynamic() const { return kind() != SymbolKind::static_value; }
  std::optional<std::int64_t> capacity() const;
  // For batch symbols: the static symbol holding the batch length.
  Symbol length() const;

  friend bool operator==(Symbol a, Symbol b) noexcept { return a.id_ == b.id_; }

 private:
  explicit Symbol(std::uint32_t id) : id_(id) {}
  friend struct detail::ExtentNode;  // rebuilds handles from ids it stored, without the registry lock
  std::uint32_t id_;
};

}  // namespace graphsafe
