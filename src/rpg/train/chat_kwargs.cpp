#include "rpg/train/chat_kwargs.h"

#include <charconv>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>

#include "rpg/core/error.h"

namespace rpg {
namespace {

nlohmann::ordered_json to_json(const ConfigNode& n) {
  using J = nlohmann::ordered_json;
  switch (n.kind) {
    case ConfigNode::Kind::Null: return nullptr;
    case ConfigNode::Kind::Map: {
      J o = J::object();
      for (const auto& e : n.map) o[e.key] = to_json(e.value);
      return o;
    }
    case ConfigNode::Kind::List: {
      J a = J::array();
      for (const auto& x : n.list) a.push_back(to_json(x));
      return a;
    }
    case ConfigNode::Kind::Scalar: break;
  }
  const std::string& s = n.scalar;
  if (n.quoted) return s;
  if (s == "true" || s == "True") return true;
  if (s == "false" || s == "False") return false;
  if (s == "null" || s == "~" || s == "Null") return nullptr;
  int64_t i = 0;
  auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), i);
  if (ec == std::errc() && p == s.data() + s.size() && !s.empty()) return i;
  char* end = nullptr;
  double d = std::strtod(s.c_str(), &end);
  if (!s.empty() && end == s.c_str() + s.size()) return d;
  return s;
}

ConfigNode to_node(const nlohmann::ordered_json& j) {
  ConfigNode n;
  if (j.is_null()) return n;
  if (j.is_object()) {
    n.kind = ConfigNode::Kind::Map;
    for (auto it = j.begin(); it != j.end(); ++it) n.map.push_back({it.key(), to_node(it.value())});
  } else if (j.is_array()) {
    n.kind = ConfigNode::Kind::List;
    for (const auto& x : j) n.list.push_back(to_node(x));
  } else {
    n.kind = ConfigNode::Kind::Scalar;
    n.quoted = j.is_string();
    n.scalar = j.is_string() ? j.get<std::string>() : j.dump();
  }
  return n;
}

}  // namespace

template <>
void ConfigLoader::operator()<tok::ChatTemplateKwargs>(std::string_view key, tok::ChatTemplateKwargs& field,
                                                       std::string_view) {
  std::string full = config_detail::join_key(prefix_, key);
  state_->leaves.push_back(full);
  const ConfigNode* child = child_of(key);
  if (!child) return;
  try {
    field = child->is_null() ? tok::ChatTemplateKwargs() : tok::ChatTemplateKwargs::from_json(to_json(*child), full);
  } catch (const ValueError& e) {
    throw ConfigError(str(child->where, ": ", e.what()));
  }
}

template <>
void ConfigWriter::operator()<tok::ChatTemplateKwargs>(std::string_view key, const tok::ChatTemplateKwargs& field,
                                                       std::string_view) {
  add(key, to_node(field.json()));
}

template <>
void ConfigLoader::operator()<JsonMapping>(std::string_view key, JsonMapping& field, std::string_view) {
  std::string full = config_detail::join_key(prefix_, key);
  state_->leaves.push_back(full);
  const ConfigNode* child = child_of(key);
  if (!child) return;
  if (child->is_null()) {
    field = JsonMapping{};
    return;
  }
  if (child->kind != ConfigNode::Kind::Map) config_detail::throw_type_error(*child, full, "a mapping");
  field.json = to_json(*child).dump();
}

template <>
void ConfigWriter::operator()<JsonMapping>(std::string_view key, const JsonMapping& field, std::string_view) {
  add(key, to_node(nlohmann::ordered_json::parse(field.json)));
}

}  // namespace rpg
