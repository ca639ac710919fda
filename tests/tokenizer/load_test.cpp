// The tokenizer.json loader has two readers (src/rpg/tokenizer/load.cpp): a fast scanner for
// what Hugging Face writes, which gives up on anything unusual, and the full JSON parser
// (nlohmann, streamed) that reads everything else. These tests hold the fast one to the full
// one: on each input both must give the same tokenizer (every id's token, every token's id,
// the same encodings) or fail with the same message. The full parser's behaviour is checked
// against Hugging Face by the HfTokenizers / RealQwenVocab tests and by TokenizerBadInput.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/tokenizer/tokenizer.h"
#include "rpg/tokenizer/tokenizer_impl.h"
#include "test_util.h"
#include "tiny_tokenizer.h"

namespace {

using rpg::tok::Tokenizer;
namespace fs = std::filesystem;

// Everything a caller can observe of a loaded tokenizer, as text.
std::string fingerprint(const Tokenizer& tok, const std::vector<std::string>& texts) {
  std::string out = rpg::str("vocab_size ", tok.vocab_size(), "\n");
  for (size_t id = 0; id < tok.vocab_size(); ++id) {
    std::string token;
    try {
      token = tok.id_to_token(static_cast<rpg::tok::TokenId>(id));
    } catch (const rpg::ValueError&) {
      out += rpg::str(id, " -\n");
      continue;
    }
    auto back = tok.token_to_id(token);
    out += rpg::str(id, " ", nlohmann::json(token).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), " ",
                    back ? std::to_string(*back) : "none", tok.is_special(static_cast<rpg::tok::TokenId>(id)) ? " special" : "",
                    "\n");
  }
  for (const auto& text : texts) {
    for (bool special : {false, true}) {
      auto ids = tok.encode(text, special);
      out += "encode";
      for (auto id : ids) out += " " + std::to_string(id);
      out += "\n";
    }
  }
  return out;
}

// The outcome of loading `text` with the fast scanner allowed, or with the full parser only.
std::string outcome(const std::string& text, bool full_only, const std::vector<std::string>& texts) {
  rpg::tok::tokenizer_detail::full_json_parse_only() = full_only;
  std::string out;
  try {
    Tokenizer tok = Tokenizer::from_json(text, "t/tokenizer.json");
    out = fingerprint(tok, texts);
  } catch (const rpg::Error& e) {
    out = rpg::str("error: ", e.what());
  }
  rpg::tok::tokenizer_detail::full_json_parse_only() = false;
  return out;
}

// The first line where two outcomes differ (they are long).
std::string first_difference(const std::string& fast, const std::string& full) {
  size_t i = 0;
  while (i < fast.size() && i < full.size() && fast[i] == full[i]) ++i;
  size_t start = fast.rfind('\n', i == 0 ? 0 : i - 1);
  start = start == std::string::npos ? 0 : start + 1;
  auto line = [&](const std::string& s) { return s.substr(start, std::min<size_t>(s.find('\n', start) - start, 300)); };
  return rpg::str("\n  fast: ", line(fast), "\n  full: ", line(full));
}

const std::vector<std::string> kTexts = {"hello world, the thing is", "中文 😀 123\n\n  x", "<|im_start|>the<|im_end|>",
                                         "q\"zé/ and of"};

// Inserts `entry` right after the opening brace of model.vocab.
std::string with_vocab_entry(std::string text, const std::string& entry) {
  size_t at = text.find("\"vocab\":{");
  EXPECT_NE(at, std::string::npos);
  return text.insert(at + 9, entry);
}

TEST(TokenizerLoad, FastScannerAgreesWithTheFullParser) {
  using json = nlohmann::ordered_json;
  const json base = rpg::test::tiny_tokenizer_json("", false);
  const std::string compact = base.dump();
  std::vector<std::pair<std::string, std::string>> cases;  // (name, tokenizer.json text)
  cases.emplace_back("compact", compact);
  cases.emplace_back("indented", base.dump(2));
  {
    json j = base;  // merges first, and "a b" strings instead of pairs
    json merges = json::array();
    for (auto& m : j["model"]["merges"]) merges.push_back(m[0].get<std::string>() + " " + m[1].get<std::string>());
    json model = {{"type", "BPE"}, {"merges", merges}, {"vocab", j["model"]["vocab"]}};
    j["model"] = model;
    cases.emplace_back("merges first, as strings", j.dump());
    json mixed = merges;
    mixed[0] = base["model"]["merges"][0];
    j["model"]["merges"] = mixed;
    cases.emplace_back("mixed merge forms", j.dump(1, '\t'));
  }
  {
    json j = base;  // decoys: "vocab" / "merges" keys elsewhere
    json model = {{"extra", {{"vocab", {{"x", 1}}}, {"merges", json::array({"a b"})}}}};
    for (auto& [k, v] : base["model"].items()) model[k] = v;
    j["model"] = model;
    json root = {{"vocab", {{"!", 5}}}, {"merges", json::array()}};
    for (auto& [k, v] : j.items()) root[k] = v;
    cases.emplace_back("decoy keys", root.dump());
  }
  // Escapes in tokens (the fast scanner decodes these itself; surrogates go to the full parser).
  cases.emplace_back("escapes", with_vocab_entry(compact, R"("q\"z\u00e9\/\\\b\f\n\r\t":900,)"));
  cases.emplace_back("surrogate pair", with_vocab_entry(compact, R"("\ud83d\ude00":901,)"));
  cases.emplace_back("lone surrogate", with_vocab_entry(compact, R"("\ud83d":901,)"));
  cases.emplace_back("bad escape", with_vocab_entry(compact, R"("\x41":901,)"));
  cases.emplace_back("short unicode escape", with_vocab_entry(compact, R"("\u00e":901,)"));
  cases.emplace_back("raw UTF-8 token", with_vocab_entry(compact, "\"\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80\":901,"));
  cases.emplace_back("invalid UTF-8", with_vocab_entry(compact, "\"a\xff\":901,"));
  cases.emplace_back("overlong UTF-8", with_vocab_entry(compact, "\"\xc0\xaf\":901,"));
  cases.emplace_back("encoded surrogate", with_vocab_entry(compact, "\"\xed\xa0\x80\":901,"));
  cases.emplace_back("truncated UTF-8", with_vocab_entry(compact, "\"\xe4\xb8\":901,"));
  cases.emplace_back("control character", with_vocab_entry(compact, "\"a\x01z\":901,"));
  // Keys and ids.
  cases.emplace_back("duplicate key", with_vocab_entry(compact, R"("!":950,)"));
  cases.emplace_back("duplicate id", with_vocab_entry(compact, R"("zzz":3,)"));
  cases.emplace_back("float id", with_vocab_entry(compact, R"("zzz":1.0,)"));
  cases.emplace_back("exponent id", with_vocab_entry(compact, R"("zzz":1e2,)"));
  cases.emplace_back("negative id", with_vocab_entry(compact, R"("zzz":-1,)"));
  cases.emplace_back("leading zero", with_vocab_entry(compact, R"("zzz":01,)"));
  cases.emplace_back("huge id", with_vocab_entry(compact, R"("zzz":99999999999,)"));
  cases.emplace_back("id past 2^28", with_vocab_entry(compact, R"("zzz":268435457,)"));
  cases.emplace_back("id past the vocabulary", with_vocab_entry(compact, R"("zzz":1000,)"));
  cases.emplace_back("string id", with_vocab_entry(compact, R"("zzz":"1",)"));
  cases.emplace_back("missing colon", with_vocab_entry(compact, R"("zzz" 1,)"));
  cases.emplace_back("comma before a brace", with_vocab_entry(compact, R"("zzz":900,})"));
  {
    std::string t = compact;  // vocab / merges of the wrong shape
    size_t at = t.find("\"merges\":[");
    cases.emplace_back("merge of three", std::string(t).insert(at + 10, R"(["a","b","c"],)"));
    cases.emplace_back("merge string of three", std::string(t).insert(at + 10, R"("a b c",)"));
    cases.emplace_back("merge without space", std::string(t).insert(at + 10, R"("ab",)"));
    cases.emplace_back("merge number", std::string(t).insert(at + 10, R"(5,)"));
    cases.emplace_back("merge unknown token", std::string(t).insert(at + 10, R"("zz q",)"));
    json j = base;
    j["model"]["vocab"] = json::array();
    cases.emplace_back("vocab array", j.dump());
    j = base;
    j["model"]["merges"] = json::object();
    cases.emplace_back("merges object", j.dump());
    j = base;
    j["model"]["merges"] = json::array();
    cases.emplace_back("no merges", j.dump());
    j = base;
    j["model"].erase("merges");
    cases.emplace_back("merges missing", j.dump());
  }
  // Document structure.
  cases.emplace_back("trailing garbage", compact + " x");
  cases.emplace_back("trailing whitespace", compact + " \n\t\r");
  cases.emplace_back("truncated in vocab", compact.substr(0, compact.find("\"vocab\":{") + 200));
  cases.emplace_back("truncated in merges", compact.substr(0, compact.find("\"merges\":[") + 30));
  cases.emplace_back("two models", compact.substr(0, compact.size() - 1) + ",\"model\":" + base["model"].dump() + "}");
  cases.emplace_back("unbalanced elsewhere", std::string(compact).replace(compact.find("\"padding\":null"), 14, "\"padding\":[}"));
  cases.emplace_back("not an object", "[" + compact + "]");
  cases.emplace_back("empty", "");

  const int64_t fast_before = rpg::tok::tokenizer_detail::fast_json_loads();
  int accepted = 0;
  for (const auto& [name, text] : cases) {
    SCOPED_TRACE(name);
    std::string full = outcome(text, /*full_only=*/true, kTexts);
    std::string fast = outcome(text, /*full_only=*/false, kTexts);
    EXPECT_TRUE(fast == full) << first_difference(fast, full);
    accepted += !full.starts_with("error:");
  }
  // Both kinds occur, and the fast scanner did read the usual files itself.
  EXPECT_GE(accepted, 8);
  EXPECT_LE(accepted, static_cast<int>(cases.size()) - 15);
  EXPECT_GE(rpg::tok::tokenizer_detail::fast_json_loads() - fast_before, 7);
}

// The real Qwen3 tokenizer.json (151,643 ranks, 11 MB): both readers give the same tokenizer,
// and the fast one is the one that read it.
TEST(RealQwenVocab, FastLoadEqualsFullParse) {
  const fs::path dir = rpg::test::oracle_output_dir("tokenizer_real_qwen.py") / "qwen3";
  const std::string text = rpg::read_file(dir / "tokenizer.json");
  std::vector<std::string> texts = kTexts;
  texts.push_back("Let $f(x) = x^2 + 3x$. Find f(12). <think>\nThe answer is \\boxed{180}.</think>");
  const int64_t fast_before = rpg::tok::tokenizer_detail::fast_json_loads();
  std::string full = outcome(text, /*full_only=*/true, texts);
  std::string fast = outcome(text, /*full_only=*/false, texts);
  EXPECT_EQ(rpg::tok::tokenizer_detail::fast_json_loads() - fast_before, 1);
  ASSERT_FALSE(full.starts_with("error:")) << full;
  EXPECT_GT(full.size(), 151643u * 8);
  EXPECT_TRUE(fast == full) << first_difference(fast, full);
}

}  // namespace
