#include "rpg/core/config.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <fstream>
#include <sstream>

namespace rpg {

const ConfigNode* ConfigNode::find(std::string_view key) const {
  for (const auto& e : map)
    if (e.key == key) return &e.value;
  return nullptr;
}

ConfigNode* ConfigNode::find(std::string_view key) {
  for (auto& e : map)
    if (e.key == key) return &e.value;
  return nullptr;
}

namespace {

std::string where_of(std::string_view source, const YAML::Mark& mark) {
  if (mark.is_null()) return std::string(source);
  return str(source, ":", mark.line + 1, ":", mark.column + 1);
}

// yaml-cpp shares an anchored node between its aliases, but the ConfigNode tree copies it
// at each one: nine lists of nine aliases of the previous ("billion laughs") are a few
// hundred bytes of YAML and 9^9 nodes here. A real configuration has a few hundred nodes
// and a few levels; these bounds are far above that and far below exhausting memory.
constexpr size_t kMaxConfigNodes = 200000;
constexpr int kMaxConfigDepth = 64;

struct Budget {
  size_t nodes = 0;
};

ConfigNode convert(const YAML::Node& y, std::string_view source, Budget& budget, int depth = 0) {
  if (++budget.nodes > kMaxConfigNodes)
    throw ConfigError(str(source, ": expands to more than ", kMaxConfigNodes,
                          " nodes (each YAML alias copies its anchor; is it an alias bomb?)"));
  if (depth > kMaxConfigDepth)
    throw ConfigError(str(where_of(source, y.Mark()), ": nested more than ", kMaxConfigDepth, " levels deep"));
  ConfigNode n;
  n.where = where_of(source, y.Mark());
  switch (y.Type()) {
    case YAML::NodeType::Undefined:
    case YAML::NodeType::Null:
      n.kind = ConfigNode::Kind::Null;
      break;
    case YAML::NodeType::Scalar:
      n.kind = ConfigNode::Kind::Scalar;
      n.scalar = y.Scalar();
      // yaml-cpp tags plain scalars "?" and quoted ones "!".
      n.quoted = y.Tag() == "!";
      break;
    case YAML::NodeType::Sequence:
      n.kind = ConfigNode::Kind::List;
      for (const auto& item : y) n.list.push_back(convert(item, source, budget, depth + 1));
      break;
    case YAML::NodeType::Map:
      n.kind = ConfigNode::Kind::Map;
      for (const auto& kv : y) {
        if (!kv.first.IsScalar())
          throw ConfigError(str(where_of(source, kv.first.Mark()), ": mapping keys must be plain scalars"));
        std::string key = kv.first.Scalar();
        if (n.find(key))
          throw ConfigError(str(where_of(source, kv.first.Mark()), ": duplicate key '", key, "'"));
        n.map.push_back({key, convert(kv.second, source, budget, depth + 1)});
      }
      break;
  }
  return n;
}

YAML::Node load_yaml(std::string_view text, std::string_view source) {
  try {
    return YAML::Load(std::string(text));
  } catch (const YAML::Exception& e) {
    throw ConfigError(str(where_of(source, e.mark), ": malformed YAML: ", e.msg));
  }
}

void emit(YAML::Emitter& out, const ConfigNode& n) {
  switch (n.kind) {
    case ConfigNode::Kind::Null:
      out << YAML::Null;
      break;
    case ConfigNode::Kind::Scalar:
      if (n.quoted) out << YAML::DoubleQuoted;
      out << n.scalar;
      break;
    case ConfigNode::Kind::List:
      out << (n.list.empty() ? YAML::Flow : YAML::Block) << YAML::BeginSeq;
      for (const auto& item : n.list) emit(out, item);
      out << YAML::EndSeq;
      break;
    case ConfigNode::Kind::Map:
      out << (n.map.empty() ? YAML::Flow : YAML::Block) << YAML::BeginMap;
      for (const auto& e : n.map) {
        out << YAML::Key << e.key << YAML::Value;
        emit(out, e.value);
      }
      out << YAML::EndMap;
      break;
  }
}

std::vector<std::string> split_key(std::string_view key, std::string_view context) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    size_t dot = key.find('.', start);
    std::string_view part = key.substr(start, dot == std::string_view::npos ? std::string_view::npos : dot - start);
    if (part.empty()) throw ConfigError(str(context, ": empty key component in '", key, "'"));
    parts.emplace_back(part);
    if (dot == std::string_view::npos) break;
    start = dot + 1;
  }
  return parts;
}

}  // namespace

ConfigNode parse_yaml(std::string_view text, std::string_view source) {
  Budget budget;
  ConfigNode root = convert(load_yaml(text, source), source, budget);
  if (root.is_null()) root.kind = ConfigNode::Kind::Map;  // empty document
  if (root.kind != ConfigNode::Kind::Map)
    throw ConfigError(str(source, ": the top level must be a mapping of keys to values"));
  return root;
}

ConfigNode load_yaml_file(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str("cannot open config file ", path.string()));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) throw IoError(str("cannot read config file ", path.string()));
  return parse_yaml(text.str(), path.string());
}

void apply_override(ConfigNode& root, std::string_view assignment) {
  const std::string context = str("override '", assignment, "'");
  std::string_view a = assignment;
  if (!a.empty() && a[0] == '~') {
    auto parts = split_key(a.substr(1), context);
    ConfigNode* node = &root;
    for (size_t i = 0; i + 1 < parts.size(); ++i) {
      node = node->kind == ConfigNode::Kind::Map ? node->find(parts[i]) : nullptr;
      if (!node) throw ConfigError(str(context, ": no key '", a.substr(1), "' to delete"));
    }
    auto& m = node->map;
    auto it = std::find_if(m.begin(), m.end(), [&](const auto& e) { return e.key == parts.back(); });
    if (it == m.end()) throw ConfigError(str(context, ": no key '", a.substr(1), "' to delete"));
    m.erase(it);
    return;
  }
  if (a.starts_with("++")) a.remove_prefix(2);
  else if (a.starts_with("+")) a.remove_prefix(1);
  size_t eq = a.find('=');
  if (eq == std::string_view::npos)
    throw ConfigError(str(context, ": expected key=value (e.g. actor_rollout_ref.actor.optim.lr=1e-6)"));
  auto parts = split_key(a.substr(0, eq), context);
  std::string_view value_text = a.substr(eq + 1);

  Budget budget;
  ConfigNode value = convert(load_yaml(value_text, context), context, budget);
  value.where = context;
  // An empty right-hand side (`key=`) is YAML null, as in Hydra.
  ConfigNode* node = &root;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (node->is_null()) node->kind = ConfigNode::Kind::Map;
    if (node->kind != ConfigNode::Kind::Map) {
      std::string prefix;
      for (size_t j = 0; j < i; ++j) prefix += (j ? "." : "") + parts[j];
      throw ConfigError(str(context, ": '", prefix, "' is a value, not a mapping"));
    }
    ConfigNode* child = node->find(parts[i]);
    if (!child) {
      node->map.push_back({parts[i], ConfigNode{}});
      child = &node->map.back().value;
      child->where = context;
    }
    node = child;
  }
  *node = std::move(value);
}

std::string to_yaml(const ConfigNode& node) {
  YAML::Emitter out;
  out.SetDoublePrecision(17);
  emit(out, node);
  return std::string(out.c_str()) + "\n";
}

namespace config_detail {

[[noreturn]] void throw_type_error(const ConfigNode& n, const std::string& key, std::string_view expected) {
  std::string got;
  switch (n.kind) {
    case ConfigNode::Kind::Null: got = "null"; break;
    case ConfigNode::Kind::Scalar: got = str("'", n.scalar, "'"); break;
    case ConfigNode::Kind::List: got = "a list"; break;
    case ConfigNode::Kind::Map: got = "a mapping"; break;
  }
  throw ConfigError(str(n.where, ": ", key, ": expected ", expected, ", got ", got));
}

namespace {
const std::string& scalar_text(const ConfigNode& n, const std::string& key, std::string_view expected) {
  if (n.kind != ConfigNode::Kind::Scalar || n.quoted) throw_type_error(n, key, expected);
  return n.scalar;
}

template <class Int>
Int parse_int(const ConfigNode& n, const std::string& key) {
  const std::string& s = scalar_text(n, key, "an integer");
  std::string_view v = s;
  if (v.starts_with('+')) v.remove_prefix(1);
  Int out{};
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec == std::errc::result_out_of_range) throw_type_error(n, key, "an integer in range");
  if (ec != std::errc() || end != v.data() + v.size() || v.empty()) {
    // Scripts often write sizes as 1e4; accept a float literal that is an exact integer.
    double d = 0;
    auto [dend, dec] = std::from_chars(v.data(), v.data() + v.size(), d);
    if (dec == std::errc() && dend == v.data() + v.size() && std::isfinite(d) && d == std::floor(d) &&
        std::fabs(d) < 9.0e15) {
      return static_cast<Int>(d);
    }
    throw_type_error(n, key, "an integer");
  }
  return out;
}
}  // namespace

void from_node(const ConfigNode& n, bool& out, const std::string& key) {
  std::string s = scalar_text(n, key, "a boolean (true/false)");
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "true") out = true;
  else if (s == "false") out = false;
  else throw_type_error(n, key, "a boolean (true/false)");
}

void from_node(const ConfigNode& n, int& out, const std::string& key) { out = parse_int<int>(n, key); }
void from_node(const ConfigNode& n, int64_t& out, const std::string& key) { out = parse_int<int64_t>(n, key); }

void from_node(const ConfigNode& n, double& out, const std::string& key) {
  const std::string& s = scalar_text(n, key, "a finite number");
  std::string_view v = s;
  if (v.starts_with('+')) v.remove_prefix(1);
  auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), out);
  if (ec != std::errc() || end != v.data() + v.size() || v.empty() || !std::isfinite(out))
    throw_type_error(n, key, "a finite number");
}

void from_node(const ConfigNode& n, std::string& out, const std::string& key) {
  if (n.kind != ConfigNode::Kind::Scalar) throw_type_error(n, key, "a string");
  out = n.scalar;
}

void from_node(const ConfigNode& n, std::vector<std::string>& out, const std::string& key) {
  if (n.kind == ConfigNode::Kind::Scalar) {
    out = {n.scalar};
    return;
  }
  if (n.kind != ConfigNode::Kind::List) throw_type_error(n, key, "a list of strings");
  out.clear();
  for (size_t i = 0; i < n.list.size(); ++i) {
    std::string value;
    from_node(n.list[i], value, key + "[" + std::to_string(i) + "]");
    out.push_back(std::move(value));
  }
}

namespace {
ConfigNode scalar(std::string text, bool quoted = false) {
  ConfigNode n;
  n.kind = ConfigNode::Kind::Scalar;
  n.scalar = std::move(text);
  n.quoted = quoted;
  return n;
}
}  // namespace

ConfigNode to_node(bool v) { return scalar(v ? "true" : "false"); }
ConfigNode to_node(int v) { return scalar(std::to_string(v)); }
ConfigNode to_node(int64_t v) { return scalar(std::to_string(v)); }
ConfigNode to_node(double v) {
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);  // shortest round-trip form
  std::string s(buf, end);
  // Keep it a float for YAML readers: 1 -> 1.0, 1e-06 stays.
  if (s.find_first_of(".eEn") == std::string::npos) s += ".0";
  return scalar(s);
}
ConfigNode to_node(const std::string& v) {
  // Quote strings that YAML would otherwise read as another type.
  ConfigNode probe = scalar(v);
  bool looks_typed = v.empty() || v == "null" || v == "~" || v == "true" || v == "false" || v == "True" ||
                     v == "False";
  if (!looks_typed) {
    double d;
    auto [end, ec] = std::from_chars(v.data(), v.data() + v.size(), d);
    looks_typed = ec == std::errc() && end == v.data() + v.size();
  }
  probe.quoted = looks_typed;
  return probe;
}

}  // namespace config_detail

void ConfigLoader::ignored(std::string_view key, std::string_view why) {
  std::string full = config_detail::join_key(prefix_, key);
  state_->ignored.push_back(full);
  if (const ConfigNode* child = child_of(key); child && !child->is_null())
    state_->notices.push_back(str(full, " has no effect in rpg (", why, ")"));
}

void ConfigLoader::check_map(const ConfigNode& map, const std::string& prefix) const {
  auto contains = [](const std::vector<std::string>& v, const std::string& k) {
    return std::find(v.begin(), v.end(), k) != v.end();
  };
  for (const auto& [key, child] : map.map) {
    std::string full = config_detail::join_key(prefix, key);
    if (contains(state_->leaves, full) || contains(state_->ignored, full)) continue;
    if (contains(state_->sections, full)) {
      if (child.kind == ConfigNode::Kind::Map) check_map(child, full);
      continue;
    }
    std::vector<std::string> all = state_->leaves;
    all.insert(all.end(), state_->sections.begin(), state_->sections.end());
    std::string hint = nearest(full, all);
    throw ConfigError(str(child.where, ": unknown key '", full, "'",
                          hint.empty() ? std::string() : str("; did you mean '", hint, "'?")));
  }
}

void ConfigLoader::check_no_unknown_keys(const ConfigNode& root) const { check_map(root, prefix_); }

void ConfigWriter::add(std::string_view key, ConfigNode value) {
  node_.map.push_back({std::string(key), std::move(value)});
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest(std::string_view word, const std::vector<std::string>& candidates) {
  auto last = [](std::string_view s) {
    size_t dot = s.rfind('.');
    return dot == std::string_view::npos ? s : s.substr(dot + 1);
  };
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& c : candidates) {
    // Compare whole paths, and also last components, so that a key placed under the wrong
    // section (actor.lr instead of actor.optim.lr) is still found.
    size_t d = std::min(edit_distance(word, c), edit_distance(last(word), last(c)) + 1);
    if (d < best_d) best_d = d, best = c;
  }
  size_t limit = std::max<size_t>(2, last(word).size() / 3);
  return best_d <= limit ? best : std::string();
}

}  // namespace rpg
