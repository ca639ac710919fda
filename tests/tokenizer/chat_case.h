// One row of a chat_cases.jsonl written by a transformers oracle (template, messages,
// add_generation_prompt, extra kwargs, and either the expected text or the error
// transformers raised), rendered by rpg and compared. Shared by the chat-template tests
// on fixture vocabularies and on the real Qwen vocabulary.
#pragma once

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/tokenizer/tokenizer.h"

namespace rpg::test {

// Where two renderings part, with 40 bytes of context each side.
inline std::string first_difference(const std::string& got, const std::string& want) {
  size_t i = 0;
  while (i < got.size() && i < want.size() && got[i] == want[i]) ++i;
  auto ctx = [&](const std::string& s) {
    return nlohmann::json(s.substr(i > 40 ? i - 40 : 0, 80)).dump(-1, ' ', true, nlohmann::json::error_handler_t::replace);
  };
  return rpg::str("first difference at byte ", i, "\n  hf:  ", ctx(want), "\n  rpg: ", ctx(got));
}

// The rendered text when rpg renders what transformers rendered. When transformers raised,
// rpg must raise ValueError (counted in `raised`); any other outcome is a test failure.
// Either way nullopt unless the texts are equal.
inline std::optional<std::string> render_chat_case(const tok::Tokenizer& tok, const nlohmann::ordered_json& c,
                                                   int& raised) {
  if (c.contains("error")) {
    EXPECT_THROW(tok.apply_chat_template(c["messages"], c["add_generation_prompt"], c["extra"]), rpg::ValueError)
        << "transformers raised " << c["error"];
    ++raised;
    return std::nullopt;
  }
  const std::string want = c["expected"];
  std::string got;
  try {
    got = tok.apply_chat_template(c["messages"], c["add_generation_prompt"], c["extra"]);
  } catch (const rpg::Error& e) {
    ADD_FAILURE() << "rpg raised: " << e.what();
    return std::nullopt;
  }
  if (got != want) {
    ADD_FAILURE() << first_difference(got, want);
    return std::nullopt;
  }
  return got;
}

}  // namespace rpg::test
