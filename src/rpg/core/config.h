// Configuration: a YAML file plus `a.b.c=value` overrides (the Hydra/verl style),
// bound to plain structs with defaults through one `visit` function per struct:
//
//   struct OptimConfig {
//     double lr = 1e-6;  // learning rate
//     template <class V> void visit(V& v) { v("lr", lr, "learning rate"); }
//   };
//
// The same `visit` drives loading (type errors name the key, the expected type and the
// place in the file), printing, and key listings. Keys in the input that no `visit`
// asked for are errors with the nearest valid key suggested.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "rpg/core/error.h"

namespace rpg {

struct ConfigEntry;

// A YAML document as a tree. Scalars keep their text; conversion happens on typed access
// so that errors can name the expected type.
struct ConfigNode {
  enum class Kind { Null, Scalar, Map, List };
  Kind kind = Kind::Null;
  std::string scalar;  // Kind::Scalar: the text as written
  bool quoted = false;  // Kind::Scalar: written in quotes ("1" is a string, never an int)
  std::vector<ConfigEntry> map;  // Kind::Map, in file order
  std::vector<ConfigNode> list;                         // Kind::List
  std::string where;  // "file.yaml:12:3" or "override 'a.b=1'", for error messages

  const ConfigNode* find(std::string_view key) const;
  ConfigNode* find(std::string_view key);
  bool is_null() const { return kind == Kind::Null; }
};

struct ConfigEntry {
  std::string key;
  ConfigNode value;
};

// Parses YAML text (a mapping at the top). `source` names it in errors. Throws ConfigError.
ConfigNode parse_yaml(std::string_view text, std::string_view source);
// Reads and parses a YAML file. Throws IoError / ConfigError.
ConfigNode load_yaml_file(const std::filesystem::path& path);
// Applies one `a.b.c=value` override (value in YAML flow syntax: 1, 1e-6, true, null,
// [1, 2], "text"). A leading `+` or `++` (Hydra's add / force-add) is accepted; `~a.b`
// deletes a key. Creates intermediate maps as needed. Throws ConfigError.
void apply_override(ConfigNode& root, std::string_view assignment);
// Emits a tree as block-style YAML.
std::string to_yaml(const ConfigNode& node);

namespace config_detail {

// Conversions between scalars and the field types a config struct may use.
void from_node(const ConfigNode& n, bool& out, const std::string& key);
void from_node(const ConfigNode& n, int& out, const std::string& key);
void from_node(const ConfigNode& n, int64_t& out, const std::string& key);
void from_node(const ConfigNode& n, double& out, const std::string& key);
void from_node(const ConfigNode& n, std::string& out, const std::string& key);
ConfigNode to_node(bool v);
ConfigNode to_node(int v);
ConfigNode to_node(int64_t v);
ConfigNode to_node(double v);
ConfigNode to_node(const std::string& v);
[[noreturn]] void throw_type_error(const ConfigNode& n, const std::string& key, std::string_view expected);

template <class T>
void from_node(const ConfigNode& n, std::optional<T>& out, const std::string& key) {
  if (n.is_null()) {
    out.reset();
    return;
  }
  T value{};
  from_node(n, value, key);
  out = std::move(value);
}

template <class T>
void from_node(const ConfigNode& n, std::vector<T>& out, const std::string& key) {
  if (n.kind != ConfigNode::Kind::List) throw_type_error(n, key, "a list");
  out.clear();
  for (size_t i = 0; i < n.list.size(); ++i) {
    T value{};
    from_node(n.list[i], value, key + "[" + std::to_string(i) + "]");
    out.push_back(std::move(value));
  }
}

// A lone string where a list of strings is expected is a one-element list, as verl
// accepts `data.train_files=/path/train.parquet`.
void from_node(const ConfigNode& n, std::vector<std::string>& out, const std::string& key);

template <class T>
ConfigNode to_node(const std::optional<T>& v) {
  return v ? to_node(*v) : ConfigNode{};
}

template <class T>
ConfigNode to_node(const std::vector<T>& v) {
  ConfigNode n;
  n.kind = ConfigNode::Kind::List;
  for (const auto& x : v) n.list.push_back(to_node(x));
  return n;
}

inline std::string join_key(const std::string& prefix, std::string_view key) {
  return prefix.empty() ? std::string(key) : prefix + "." + std::string(key);
}

}  // namespace config_detail

// Loads a struct from a tree; records the keys it asked for so that the leftovers in the
// input can be reported as unknown.
class ConfigLoader {
 public:
  explicit ConfigLoader(const ConfigNode* node) : node_(node), state_(std::make_shared<State>()) {}

  template <class T>
  void operator()(std::string_view key, T& field, std::string_view /*help*/) {
    std::string full = config_detail::join_key(prefix_, key);
    state_->leaves.push_back(full);
    if (const ConfigNode* child = child_of(key)) config_detail::from_node(*child, field, full);
  }

  template <class S>
  void section(std::string_view key, S& sub, std::string_view /*help*/ = {}) {
    std::string full = config_detail::join_key(prefix_, key);
    state_->sections.push_back(full);
    const ConfigNode* child = child_of(key);
    if (child && child->kind != ConfigNode::Kind::Map && !child->is_null())
      config_detail::throw_type_error(*child, full, "a mapping");
    ConfigLoader inner(child);
    inner.prefix_ = full;
    inner.state_ = state_;
    sub.visit(inner);
  }

  // A key accepted for compatibility with verl scripts that has no effect here. Its whole
  // subtree is accepted; a notice is recorded when the input sets it.
  void ignored(std::string_view key, std::string_view why);

  // Throws ConfigError for the first key of the tree that no visit asked for.
  void check_no_unknown_keys(const ConfigNode& root) const;
  const std::vector<std::string>& notices() const { return state_->notices; }

 private:
  struct State {
    std::vector<std::string> leaves, sections, ignored, notices;
  };
  const ConfigNode* child_of(std::string_view key) const {
    return node_ && node_->kind == ConfigNode::Kind::Map ? node_->find(key) : nullptr;
  }
  void check_map(const ConfigNode& map, const std::string& prefix) const;

  const ConfigNode* node_;
  std::string prefix_;
  std::shared_ptr<State> state_;
};

// Turns a struct into a tree (for printing and for saving the resolved config of a run).
class ConfigWriter {
 public:
  template <class T>
  void operator()(std::string_view key, const T& field, std::string_view /*help*/) {
    add(key, config_detail::to_node(field));
  }
  template <class S>
  void section(std::string_view key, const S& sub, std::string_view /*help*/ = {}) {
    ConfigWriter inner;
    S copy = sub;  // visit() is shared with the loader and so takes a non-const this
    copy.visit(inner);
    add(key, std::move(inner.node_));
  }
  void ignored(std::string_view, std::string_view) {}
  template <class S>
  void section_root(const S& value) {
    S copy = value;
    copy.visit(*this);
  }
  ConfigNode take() { return std::move(node_); }

 private:
  void add(std::string_view key, ConfigNode value);
  ConfigNode node_ = map_node();
  static ConfigNode map_node() {
    ConfigNode n;
    n.kind = ConfigNode::Kind::Map;
    return n;
  }
};

// Result of loading: the struct plus notices (ignored verl keys) to show the user.
template <class T>
struct LoadedConfig {
  T value;
  std::vector<std::string> notices;
};

// Binds a tree to T (defaults for absent keys), rejecting unknown keys and calling
// `value.validate()` when T has one.
template <class T>
LoadedConfig<T> bind_config(const ConfigNode& root) {
  LoadedConfig<T> out;
  ConfigLoader loader(&root);
  out.value.visit(loader);
  loader.check_no_unknown_keys(root);
  if constexpr (requires(T& t) { t.validate(); }) out.value.validate();
  out.notices = loader.notices();
  return out;
}

// Reads `file` (may be empty: defaults only), applies the overrides in order, binds to T.
template <class T>
LoadedConfig<T> load_config(const std::filesystem::path& file, const std::vector<std::string>& overrides) {
  ConfigNode root = file.empty() ? parse_yaml("{}", "<defaults>") : load_yaml_file(file);
  for (const auto& o : overrides) apply_override(root, o);
  return bind_config<T>(root);
}

template <class T>
std::string config_to_yaml(const T& value) {
  ConfigWriter writer;
  writer.section_root(value);
  return to_yaml(writer.take());
}

// Levenshtein distance, for "did you mean" suggestions.
size_t edit_distance(std::string_view a, std::string_view b);
// The candidate closest to `word`, or empty when none is close enough to be a plausible typo.
std::string nearest(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace rpg
