// verl's `data.apply_chat_template_kwargs` as a config field: a free-form mapping (e.g.
// `{enable_thinking: false}` for Qwen3 runs) that the config system's typed fields cannot
// hold. The loader converts the YAML subtree to JSON (quoted scalars are strings; plain
// ones are read as YAML does: true/false, null/~, integers, floats, else strings) and
// checks it as tok::ChatTemplateKwargs::from_json does; the writer turns it back into YAML.
// Declared here, defined in chat_kwargs.cpp, so that the config header stays free of
// nlohmann/json.hpp.
#pragma once

#include <string>
#include <string_view>

#include "rpg/core/config.h"
#include "rpg/tokenizer/tokenizer.h"

namespace rpg {

// A free-form mapping passed on as JSON (custom_reward_function.reward_kwargs: the reward
// function's **kwargs). `json` is an object's JSON text; the loader refuses a non-mapping.
struct JsonMapping {
  std::string json = "{}";
  bool operator==(const JsonMapping&) const = default;
};

template <>
void ConfigLoader::operator()<JsonMapping>(std::string_view key, JsonMapping& field, std::string_view);

template <>
void ConfigWriter::operator()<JsonMapping>(std::string_view key, const JsonMapping& field, std::string_view);

template <>
void ConfigLoader::operator()<tok::ChatTemplateKwargs>(std::string_view key, tok::ChatTemplateKwargs& field,
                                                       std::string_view);

template <>
void ConfigWriter::operator()<tok::ChatTemplateKwargs>(std::string_view key, const tok::ChatTemplateKwargs& field,
                                                       std::string_view);

}  // namespace rpg
