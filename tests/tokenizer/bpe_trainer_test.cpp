// BPE training (rpg::tok::train_bpe): the tokenizer.json it writes is checked against
// Hugging Face. The oracle supplies the corpus (tokenizer_oracle's generated text) and the
// 5,000+ test strings of the tokenizer tests, then loads our files with `tokenizers` and
// transformers' AutoTokenizer and reports their ids; ours must equal both.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/tokenizer/bpe_trainer.h"
#include "rpg/tokenizer/tokenizer.h"
#include "rpg/tokenizer/unicode.h"
#include "test_util.h"

namespace {

using rpg::tok::TokenId;
using rpg::tok::Tokenizer;
using rpg::tok::BpeTrainerOptions;
namespace fs = std::filesystem;

std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

std::vector<std::string> read_jsonl_strings(const fs::path& path) {
  std::vector<std::string> out;
  std::ifstream f(path);
  for (std::string line; std::getline(f, line);) out.push_back(nlohmann::json::parse(line).get<std::string>());
  return out;
}

struct Fixture {
  std::vector<std::string> corpus;
  std::vector<std::string> strings;  // raw bytes
};

const Fixture& fixture() {
  static const Fixture fx = [] {
    fs::path dir = rpg::test::oracle_output_dir("tokenizer_trained_check.py");
    Fixture f;
    f.corpus = read_jsonl_strings(dir / "corpus.jsonl");
    for (auto& h : read_jsonl_strings(dir / "strings.jsonl")) f.strings.push_back(from_hex(h));
    return f;
  }();
  return fx;
}

BpeTrainerOptions opts(int64_t vocab) {
  BpeTrainerOptions o;
  o.vocab_size = vocab;
  return o;
}

void write_dir(const fs::path& dir, const std::vector<std::string>& lines, const BpeTrainerOptions& o) {
  auto bpe = rpg::tok::train_bpe(lines, o);
  rpg::write_file_atomic(dir / "tokenizer.json", rpg::tok::tokenizer_json(bpe, o));
  rpg::write_file_atomic(dir / "tokenizer_config.json", rpg::tok::tokenizer_config_json(bpe, o));
}

TEST(BpeTrainer, HuggingFaceLoadsOurTokenizerAndAgreesOnEveryString) {
  const auto& fx = fixture();
  ASSERT_GT(fx.corpus.size(), 10000u);
  rpg::test::TempDir tmp;
  write_dir(tmp.path(), fx.corpus, opts(3000));
  Tokenizer ours = Tokenizer::from_dir(tmp.path());
  ASSERT_EQ(ours.vocab_size(), 3000u);

  auto r = rpg::test::run_oracle("tokenizer_trained_check.py", {"check", tmp.path().string()});
  size_t n = 0, mismatches = 0, round_trips = 0;
  std::istringstream in(r.out);
  for (std::string line; std::getline(in, line); ++n) {
    auto rec = nlohmann::json::parse(line);
    std::string text = from_hex(rec["hex"].get<std::string>());
    ASSERT_EQ(text, fx.strings.at(n));
    auto hf = rec["ids"].get<std::vector<TokenId>>();
    auto ids = ours.encode(text);
    EXPECT_EQ(rec["auto_ids"].get<std::vector<TokenId>>(), hf) << "tokenizers and transformers disagree, string " << n;
    if (ids != hf && ++mismatches <= 5) ADD_FAILURE() << "string " << n << ": ids differ from Hugging Face";
    EXPECT_EQ(ours.decode(ids), from_hex(rec["dec"].get<std::string>())) << "string " << n;
    // Exact round trip wherever the normalizer leaves the text alone.
    std::string clean, norm;
    if (rpg::tok::sanitize_utf8(text, clean) && !rpg::tok::normalize(rpg::tok::NormalForm::kNFC, text, norm)) {
      EXPECT_EQ(ours.decode(ids), text) << "string " << n;
      ++round_trips;
    }
  }
  EXPECT_EQ(n, fx.strings.size());
  EXPECT_EQ(mismatches, 0u);
  EXPECT_GT(round_trips, 3000u);
}

TEST(BpeTrainer, FrequentWordsBecomeSingleTokensAndSpecialsComeLast) {
  const auto& fx = fixture();
  BpeTrainerOptions o = opts(3000);
  auto bpe = rpg::tok::train_bpe(fx.corpus, o);
  Tokenizer tok = Tokenizer::from_json(rpg::tok::tokenizer_json(bpe, o), "trained",
                                       rpg::tok::tokenizer_config_json(bpe, o));
  for (const char* w : {"the", " the", " of", " and", " theorem", " polynomial", " probability"})
    EXPECT_EQ(tok.encode(w).size(), 1u) << w;
  EXPECT_EQ(tok.encode(" the the the").size(), 3u);
  // Qwen2 splits digits one by one, so no digit run can be a token.
  for (TokenId id = 0; id < 2997; ++id) {
    std::string s = tok.decode(std::vector<TokenId>{id});
    EXPECT_FALSE(s.size() > 1 && std::isdigit(static_cast<unsigned char>(s[0])) &&
                 std::isdigit(static_cast<unsigned char>(s[1])))
        << s;
  }
  EXPECT_EQ(*tok.token_to_id("<|endoftext|>"), 2997);
  EXPECT_EQ(*tok.token_to_id("<|im_start|>"), 2998);
  EXPECT_EQ(*tok.token_to_id("<|im_end|>"), 2999);
  EXPECT_TRUE(tok.is_special(2999));
  EXPECT_EQ(*tok.eos_id(), 2999);
  EXPECT_EQ(*tok.pad_id(), 2997);
  EXPECT_FALSE(tok.bos_id().has_value());
  // The first 256 ids are the bytes in the order of their byte-level characters ('!' first).
  EXPECT_EQ(tok.id_to_token(0), "!");
  EXPECT_EQ(tok.id_to_token(255), "\xc5\x83");  // U+0143 = the 68th shifted byte (0xAD)
  EXPECT_EQ(tok.encode("<|im_start|>user\nhi<|im_end|>").front(), 2998);
}

TEST(BpeTrainer, DeterministicAndIndependentOfLineOrder) {
  const auto& fx = fixture();
  std::vector<std::string> lines(fx.corpus.begin(), fx.corpus.begin() + 6000);
  BpeTrainerOptions o = opts(1200);
  std::string a = rpg::tok::tokenizer_json(rpg::tok::train_bpe(lines, o), o);
  std::string b = rpg::tok::tokenizer_json(rpg::tok::train_bpe(lines, o), o);
  EXPECT_EQ(a, b);
  std::mt19937 rng(3);
  std::shuffle(lines.begin(), lines.end(), rng);
  EXPECT_EQ(rpg::tok::tokenizer_json(rpg::tok::train_bpe(lines, o), o), a);
}

TEST(BpeTrainer, MinFrequencyStopsTraining) {
  BpeTrainerOptions o = opts(1000);
  o.min_frequency = 3;
  auto bpe = rpg::tok::train_bpe({"hello hello hello world"}, o);
  // "hello" occurs 3 times (as "hello" and twice as " hello"), " hello" only twice.
  EXPECT_EQ(bpe.tokens.size(), 256u + 4u + 3u);
  EXPECT_EQ(bpe.merges.size(), 4u);
  EXPECT_NE(std::find(bpe.tokens.begin(), bpe.tokens.end(), "hello"), bpe.tokens.end());
  EXPECT_EQ(std::find(bpe.tokens.begin(), bpe.tokens.end(), " hello"), bpe.tokens.end());
}

TEST(BpeTrainer, SpecialTokensInTheCorpusAreNotLearned) {
  std::vector<std::string> lines(50, "<|im_start|>user\nhi there<|im_end|>\n<|endoftext|>");
  BpeTrainerOptions o = opts(400);
  auto bpe = rpg::tok::train_bpe(lines, o);
  for (size_t i = 0; i + 3 < bpe.tokens.size(); ++i) EXPECT_EQ(bpe.tokens[i].find("<|"), std::string::npos) << bpe.tokens[i];
  Tokenizer tok = Tokenizer::from_json(rpg::tok::tokenizer_json(bpe, o), "t", rpg::tok::tokenizer_config_json(bpe, o));
  EXPECT_EQ(tok.decode(tok.encode(lines[0])), lines[0]);
  EXPECT_EQ(tok.encode(" there").size(), 1u);
}

TEST(BpeTrainer, ChatMLTemplate) {
  BpeTrainerOptions o = opts(300);
  o.chat_template = "chatml";
  auto bpe = rpg::tok::train_bpe({"abc abc"}, o);
  Tokenizer tok = Tokenizer::from_json(rpg::tok::tokenizer_json(bpe, o), "t", rpg::tok::tokenizer_config_json(bpe, o));
  EXPECT_EQ(tok.apply_chat_template(std::vector<rpg::tok::ChatMessage>{{"system", "s"}, {"user", "q"}}, true),
            "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n");
  o.chat_template = "qwen2.5";
  tok = Tokenizer::from_json(rpg::tok::tokenizer_json(bpe, o), "t", rpg::tok::tokenizer_config_json(bpe, o));
  EXPECT_EQ(tok.apply_chat_template(std::vector<rpg::tok::ChatMessage>{{"user", "q"}}, false),
            "<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n"
            "<|im_start|>user\nq<|im_end|>\n");
}

TEST(BpeTrainer, BadOptionsAreOneLineErrors) {
  std::vector<std::string> lines = {"a b c"};
  EXPECT_THROW(rpg::tok::train_bpe(lines, opts(258)), rpg::ValueError);
  BpeTrainerOptions o = opts(1000);
  o.special_tokens = {"<a>", "<a>"};
  o.eos_token = o.pad_token = "<a>";
  EXPECT_THROW(rpg::tok::train_bpe(lines, o), rpg::ValueError);
  o = opts(1000);
  o.eos_token = "</s>";
  EXPECT_THROW(rpg::tok::train_bpe(lines, o), rpg::ValueError);
  o = opts(1000);
  o.chat_template = "llama";
  EXPECT_THROW(rpg::tok::train_bpe(lines, o), rpg::ValueError);
  rpg::test::TempDir tmp;
  EXPECT_THROW(rpg::tok::train_bpe_files({tmp / "missing.txt"}, tmp / "out", opts(1000)), rpg::IoError);
  rpg::test::write_text(tmp / "empty.txt", "\n\n");
  EXPECT_THROW(rpg::tok::train_bpe_files({tmp / "empty.txt"}, tmp / "out", opts(1000)), rpg::ValueError);
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(BpeTrainer, TrainFromFilesWritesALoadableDirectory) {
  rpg::test::TempDir tmp;
  std::string text;
  for (int i = 0; i < 200; ++i) text += "Solve 3 + 4 = 7. Answer: 7\r\nthe quick brown fox\n";
  rpg::test::write_text(tmp / "a.txt", text);
  rpg::test::write_text(tmp / "b.txt", "jumps over the lazy dog\n");
  auto bpe = rpg::tok::train_bpe_files({tmp / "a.txt", tmp / "b.txt"}, tmp / "tok", opts(320));
  Tokenizer tok = Tokenizer::from_dir(tmp / "tok");
  EXPECT_EQ(tok.vocab_size(), bpe.tokens.size());
  EXPECT_EQ(tok.encode(" Answer").size(), 1u);
  EXPECT_EQ(tok.decode(tok.encode("Answer: 7\njumps")), "Answer: 7\njumps");
}

}  // namespace
