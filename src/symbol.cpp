#include <graphsafe/error.hpp>
#include <graphsafe/symbol.hpp>

#include <deque>
#include <mutex>
#include <shared_mutex>

namespace graphsafe {
namespace {

struct SymbolInfo {
  std::string name;
  SymbolKind kind;
  std::optional<std::int64_t> capacity;
  std::uint32_t length_id;
};

// Process-wide registry. A deque never moves its elements, so references stay valid while other
// threads register new symbols; symbols are created at setup, never on a hot path.
struct Registry {
  std::shared_mutex mutex;
  std::deque<SymbolInfo> infos;
};

Registry& registry() {
  static Registry r;
  return r;
}

const SymbolInfo& info(std::uint32_t id) {
  auto& r = registry();
  std::shared_lock lock(r.mutex);
  return r.infos.at(id);
}

std::uint32_t add(std::string_view name, SymbolKind kind, std::optional<std::int64_t> capacity,
                  std::uint32_t length_id) {
  if (name.empty()) throw invalid_argument_error("graphsafe: a symbol needs a non-empty name");
  if (capacity && *capacity < 0)
    throw invalid_argument_error("graphsafe: symbol '" + std::string(name) + "' has capacity " +
                                 std::to_string(*capacity) + " < 0; capacities are element counts >= 0");
  auto& r = registry();
  std::unique_lock lock(r.mutex);
  r.infos.push_back({std::string(name), kind, capacity, length_id});
  return static_cast<std::uint32_t>(r.infos.size() - 1);
}

}  // namespace

Symbol Symbol::fixed(std::string_view name) {
  return Symbol(add(name, SymbolKind::static_value, std::nullopt, 0));
}
Symbol Symbol::dynamic(std::string_view name, std::optional<std::int64_t> capacity) {
  return Symbol(add(name, SymbolKind::dynamic_value, capacity, 0));
}
Symbol Symbol::batch(std::string_view name, Symbol length, std::optional<std::int64_t> capacity) {
  if (length.kind() != SymbolKind::static_value)
    throw invalid_argument_error("graphsafe: batch symbol '" + std::string(name) + "' needs a static length symbol, got '" +
                                 length.name() + "'; declare it with Symbol::fixed");
  return Symbol(add(name, SymbolKind::batch, capacity, length.id()));
}

Symbol Symbol::from_id(std::uint32_t id) {
  auto& r = registry();
  std::shared_lock lock(r.mutex);
  if (id >= r.infos.size())
    throw invalid_argument_error("graphsafe: no symbol has id " + std::to_string(id) + " (" +
                                 std::to_string(r.infos.size()) + " registered)");
  return Symbol(id);
}

const std::string& Symbol::name() const { return info(id_).name; }
SymbolKind Symbol::kind() const { return info(id_).kind; }
std::optional<std::int64_t> Symbol::capacity() const { return info(id_).capacity; }
Symbol Symbol::length() const {
  const auto& i = info(id_);
  if (i.kind != SymbolKind::batch)
    throw invalid_argument_error("graphsafe: symbol '" + i.name + "' is not a batch symbol and has no length");
  return Symbol(i.length_id);
}

}  // namespace graphsafe
