// Malformed tokenizer.json / tokenizer_config.json / templates raise rpg::FormatError naming
// the file and the reason; missing files raise IoError.
#include <gtest/gtest.h>

#include <functional>

#include "rpg/core/error.h"
#include "rpg/tokenizer/tokenizer.h"
#include "test_util.h"
#include "tiny_tokenizer.h"

namespace {

using json = nlohmann::ordered_json;
using rpg::tok::Tokenizer;

json base() { return rpg::test::tiny_tokenizer_json(rpg::test::kQwen2Regex, true); }

void expect_format_error(const std::string& tok_json, const std::string& cfg, const std::string& reason) {
  rpg::test::TempDir dir;
  rpg::test::write_text(dir / "tokenizer.json", tok_json);
  if (!cfg.empty()) rpg::test::write_text(dir / "tokenizer_config.json", cfg);
  try {
    Tokenizer::from_dir(dir.path());
    ADD_FAILURE() << "no error; expected: " << reason;
  } catch (const rpg::FormatError& e) {
    std::string msg = e.what();
    std::string file = cfg.empty() || reason.find("[config]") == std::string::npos ? "tokenizer.json" : "tokenizer_config.json";
    std::string want = reason.substr(reason.find(']') == std::string::npos ? 0 : reason.find(']') + 2);
    EXPECT_NE(msg.find((dir / file).string()), std::string::npos) << msg;
    EXPECT_NE(msg.find(want), std::string::npos) << "want '" << want << "' in: " << msg;
  }
}

TEST(TokenizerBadInput, BaseFixtureLoadsAndRoundTrips) {
  Tokenizer tok = Tokenizer::from_json(base().dump(), "tiny");
  std::string s = "hello world, the 中文 😀 <|im_start|>x";
  EXPECT_EQ(tok.decode(tok.encode(s)), s);
  EXPECT_LT(tok.encode("hello the world").size(), std::string("hello the world").size());
}

TEST(TokenizerBadInput, MalformedTokenizerJson) {
  struct Case {
    std::function<void(json&)> mutate;
    const char* reason;
  };
  const Case cases[] = {
      {[](json& j) { j.erase("model"); }, "missing \"model\""},
      {[](json& j) { j["model"]["type"] = "WordPiece"; }, "model.type: unsupported \"WordPiece\""},
      {[](json& j) { j["model"]["vocab"] = json::array(); }, "model.vocab: expected an object"},
      {[](json& j) { j["model"]["vocab"]["x"] = "seven"; }, "expected an integer id"},
      {[](json& j) { j["model"]["vocab"]["x"] = -3; }, "out of range"},
      {[](json& j) { j["model"]["merges"] = json::object(); }, "model.merges: expected an array"},
      {[](json& j) { j["model"]["merges"].push_back("a b c"); }, "expected \"left right\""},
      {[](json& j) { j["model"]["merges"].push_back(json::array({"zz", "q"})); }, "token not in vocab"},
      {[](json& j) { j["model"]["merges"].push_back(json::array({"q", "q"})); }, "merged token \"qq\" not in vocab"},
      {[](json& j) { j["model"]["merges"].push_back(42); }, "expected a pair of strings"},
      // the streamed parts (model.vocab, model.merges are read without a DOM): every other shape
      {[](json& j) { j["model"]["vocab"]["x"] = 1.5; }, "model.vocab[\"x\"]: expected an integer id"},
      {[](json& j) { j["model"]["vocab"]["x"] = json::object({{"id", 1}}); }, "model.vocab[\"x\"]: expected an integer id"},
      {[](json& j) { j["model"]["vocab"]["x"] = nullptr; }, "model.vocab[\"x\"]: expected an integer id"},
      {[](json& j) { j["model"]["merges"].push_back(json::array({"a", "b", "c"})); }, "expected a pair of strings"},
      {[](json& j) { j["model"]["merges"].push_back(json::array({"a"})); }, "expected a pair of strings"},
      {[](json& j) { j["model"]["merges"].push_back(json::array({"a", 1})); }, "expected a pair of strings"},
      {[](json& j) { j["model"]["merges"].push_back(json::array({json::array({"a"}), "b"})); }, "expected a pair of strings"},
      {[](json& j) { j["model"]["merges"].push_back(json::object()); }, "expected a pair of strings"},
      {[](json& j) { j["model"]["merges"].push_back(nullptr); }, "expected a pair of strings"},
      {[](json& j) { j["model"]["byte_fallback"] = "yes"; }, "model.byte_fallback: expected a boolean"},
      {[](json& j) { j["model"]["unk_token"] = 3; }, "model.unk_token: expected a string"},
      {[](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\w+"; }, "unsupported split regex"},
      // (found by fuzz.tokenizer_json: a non-string here escaped as nlohmann's type_error)
      {[](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["behavior"] = 7; },
       "pre_tokenizer.pretokenizers[0].behavior: expected a string"},
      {[](json& j) { j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", " "}}; }, "only {\"Regex\": ...} patterns"},
      {[](json& j) { j["pre_tokenizer"] = {{"type", "Whitespace"}}; }, "unsupported pre-tokenizer type \"Whitespace\""},
      {[](json& j) { j["pre_tokenizer"]["pretokenizers"].push_back({{"type", "Metaspace"}, {"replacement", "_"}}); },
       "Metaspace is supported only as the sole pre-tokenizer"},
      {[](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "ab"}}; }, "replacement: expected one character"},
      {[](json& j) { j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "_"}, {"prepend_scheme", "often"}}; },
       "prepend_scheme: got \"often\""},
      {[](json& j) { j["pre_tokenizer"] = j["pre_tokenizer"]["pretokenizers"][0]; }, "a Split without ByteLevel is unsupported"},
      {[](json& j) { j["normalizer"] = {{"type", "Replace"}, {"pattern", {{"Regex", " +"}}}, {"content", " "}}; },
       "only {\"String\": ...} patterns"},
      {[](json& j) { j["decoder"] = nullptr; }, "decoder: a decoder is required"},
      {[](json& j) { j["decoder"] = {{"type", "Strip"}, {"content", " "}, {"start", -1}, {"stop", 0}}; }, "start: expected a count"},
      {[](json& j) { j["normalizer"] = {{"type", "Lowercase"}}; }, "unsupported normalizer type \"Lowercase\""},
      {[](json& j) { j["decoder"] = {{"type", "WordPiece"}}; }, "unsupported decoder type \"WordPiece\""},
      {[](json& j) { j["added_tokens"][0]["content"] = ""; }, "added_tokens[0].content: empty"},
      {[](json& j) { j["added_tokens"][0]["id"] = "x"; }, "added_tokens[0].id: expected a non-negative integer"},
      {[](json& j) { j["added_tokens"][0]["single_word"] = true; }, "single_word: unsupported"},
      {[](json& j) { j["post_processor"] = {{"type", "TemplateProcessing"}, {"single", json::array()}}; }, "no $A sequence"},
      {[](json& j) { j["post_processor"] = {{"type", "BertProcessing"}}; }, "unsupported post-processor type"},
      {[](json& j) { j["truncation"] = {{"max_length", 5}}; }, "truncation: unsupported"},
  };
  for (const Case& c : cases) {
    json j = base();
    c.mutate(j);
    SCOPED_TRACE(c.reason);
    expect_format_error(j.dump(), "", c.reason);
  }
  expect_format_error("{\"model\": ", "", "invalid JSON");
  expect_format_error("[1, 2]", "", "expected a JSON object");
  expect_format_error("", "", "invalid JSON");
  // Cut inside the streamed parts.
  expect_format_error(R"({"model": {"type": "BPE", "vocab": {"a": 1, )", "", "invalid JSON");
  expect_format_error(R"({"model": {"type": "BPE", "vocab": {}, "merges": ["a b", ["a", )", "", "invalid JSON");
}

// A vocab key given twice: the last id wins, as when the file is parsed into a JSON object
// (the streamed reader must not keep the first id as a token of its own).
TEST(TokenizerBadInput, DuplicateVocabKeyLastWins) {
  const std::string text = base().dump();
  const size_t at = text.find("\"vocab\":{");
  ASSERT_NE(at, std::string::npos);
  std::string dup = text;
  dup.insert(at + 9, "\"A\":999999,");
  Tokenizer a = Tokenizer::from_json(text, "tiny"), b = Tokenizer::from_json(dup, "dup");
  EXPECT_EQ(b.vocab_size(), a.vocab_size());
  EXPECT_EQ(b.encode("A B"), a.encode("A B"));
  EXPECT_EQ(b.token_to_id("A"), a.token_to_id("A"));
  EXPECT_EQ(json::parse(dup)["model"]["vocab"]["A"], json::parse(text)["model"]["vocab"]["A"]);
}

TEST(TokenizerBadInput, MalformedConfigAndTemplate) {
  std::string tok = base().dump();
  expect_format_error(tok, "{not json", "[config] invalid JSON");
  expect_format_error(tok, R"({"bos_token": 5})", "[config] bos_token: expected a string");
  expect_format_error(tok, R"({"chat_template": 7})", "[config] chat_template: expected a string");
  expect_format_error(tok, R"({"chat_template": [{"name": "tool_use", "template": "x"}]})", "[config] no template named \"default\"");
  expect_format_error(tok, R"({"chat_template": [{"name": 3, "template": "x"}]})", "[config] no template named \"default\"");
  expect_format_error(tok, R"({"chat_template": "{% for m in messages %}{{ m }"})", "[config] chat_template:1:");
  expect_format_error(tok, R"({"chat_template": "\n\n{% macro %}"})", "[config] chat_template:3:10: expected a name");
}

TEST(TokenizerBadInput, MissingFilesAreIoErrors) {
  rpg::test::TempDir dir;
  EXPECT_THROW(Tokenizer::from_dir(dir / "nope"), rpg::IoError);
}

TEST(TokenizerBadInput, ConfigTokensAndNamedTemplates) {
  rpg::test::TempDir dir;
  rpg::test::write_text(dir / "tokenizer.json", base().dump());
  rpg::test::write_text(dir / "tokenizer_config.json",
                        R"({"bos_token": null, "eos_token": {"content": "<|im_end|>", "special": true},
                            "pad_token": "<|endoftext|>",
                            "chat_template": [{"name": "default", "template": "{{ eos_token }}{{ messages[0].content }}"},
                                              {"name": "rag", "template": "other"}]})");
  Tokenizer tok = Tokenizer::from_dir(dir.path());
  EXPECT_FALSE(tok.bos_id().has_value());
  EXPECT_EQ(tok.eos_token(), "<|im_end|>");
  EXPECT_EQ(tok.eos_id(), tok.token_to_id("<|im_end|>"));
  EXPECT_EQ(tok.pad_id(), tok.token_to_id("<|endoftext|>"));
  EXPECT_EQ(tok.apply_chat_template(std::vector<rpg::tok::ChatMessage>{{"user", "hi"}}, false), "<|im_end|>hi");
  // A chat_template.jinja file is used when the config has none.
  rpg::test::TempDir dir2;
  rpg::test::write_text(dir2 / "tokenizer.json", base().dump());
  rpg::test::write_text(dir2 / "chat_template.jinja", "[{{ messages | length }}]\n");
  EXPECT_EQ(Tokenizer::from_dir(dir2.path()).apply_chat_template(std::vector<rpg::tok::ChatMessage>{{"user", "x"}}, true), "[1]");
  rpg::test::TempDir dir3;
  rpg::test::write_text(dir3 / "tokenizer.json", base().dump());
  EXPECT_FALSE(Tokenizer::from_dir(dir3.path()).has_chat_template());
  EXPECT_THROW(Tokenizer::from_dir(dir3.path()).apply_chat_template(std::vector<rpg::tok::ChatMessage>{}, true), rpg::FormatError);
}

}  // namespace
