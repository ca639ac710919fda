// verl's `data.apply_chat_template_kwargs` as a config field: a free-form mapping (e.g.
// `{enable_thinking: false}` for Qwen3 runs) that the config system's typed fields cannot
// hold. The loader converts the YAML subtree to JSON (quoted scalars are strings; plain
// ones are read as YAML does: true/false, null/~, integers, floats, else strings) and
// checks it with rpg::check_chat_template_kwargs; the writer turns it back into YAML.
#pragma once

#include <charconv>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

#include "rpg/core/config.h"
#include "rpg/tokenizer/tokenizer.h"

namespace rpg {

struct ChatTemplateKwargs {
  nlohmann::ordered_json value = nlohmann::ordered_json::object();
};

namespace chat_kwargs_detail {

inline nlohmann::ordered_json to_json(const ConfigNode& n) {
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

inline ConfigNode to_node(const nlohmann::ordered_json& j) {
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

}  // namespace chat_kwargs_detail
}  // namespace rpg

namespace rpg {

template <>
inline void ConfigLoader::operator()<ChatTemplateKwargs>(std::string_view key, ChatTemplateKwargs& field,
                                                                std::string_view) {
  std::string full = config_detail::join_key(prefix_, key);
  state_->leaves.push_back(full);
  const ConfigNode* child = child_of(key);
  if (!child) return;
  field.value = child->is_null() ? nlohmann::ordered_json::object() : chat_kwargs_detail::to_json(*child);
  try {
    check_chat_template_kwargs(field.value, full);
  } catch (const ValueError& e) {
    throw ConfigError(str(child->where, ": ", e.what()));
  }
}

template <>
inline void ConfigWriter::operator()<ChatTemplateKwargs>(std::string_view key,
                                                                const ChatTemplateKwargs& field,
                                                                std::string_view) {
  add(key, chat_kwargs_detail::to_node(field.value));
}

}  // namespace rpg
