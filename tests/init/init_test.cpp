// `rpg tokenizer train` and `rpg model init` run as a user runs them; transformers then
// loads the model directory (no missing or unexpected weights), renders the chat template
// as we do, tokenizes as we do and computes the same logits from the weights we wrote.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/config.h"
#include "rpg/model/init.h"
#include "rpg/tokenizer/tokenizer.h"
#include "test_util.h"

namespace {

namespace fs = std::filesystem;
using rpg::test::run_process;

// A training corpus: the tokenizer oracle's generated text plus some arithmetic.
fs::path write_corpus(const fs::path& dir) {
  fs::path src = rpg::test::oracle_output_dir("tokenizer_trained_check.py") / "corpus.jsonl";
  std::ifstream in(src);
  std::string text;
  for (std::string line; std::getline(in, line);) text += nlohmann::json::parse(line).get<std::string>() + "\n";
  for (int i = 0; i < 500; ++i) text += "Solve " + std::to_string(i) + " + 7. Answer: " + std::to_string(i + 7) + "\n";
  fs::path out = dir / "corpus.txt";
  rpg::test::write_text(out, text);
  return out;
}

rpg::test::ProcessResult rpg_cmd(std::vector<std::string> args) {
  args.insert(args.begin(), rpg::test::rpg_binary().string());
  return run_process(args, {"OMP_NUM_THREADS=1"});
}

std::string file_bytes(const fs::path& p) { return rpg::read_file(p); }

TEST(ModelInit, CliModelLoadsInTransformersWithTheSameTokensTemplateAndLogits) {
  rpg::test::TempDir tmp;
  fs::path corpus = write_corpus(tmp.path());
  auto r = rpg_cmd({"tokenizer", "train", "--corpus", corpus.string(), "--vocab-size", "1000", "--output",
                    (tmp / "tok").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("1000 tokens"), std::string::npos) << r.out;
  r = rpg_cmd({"model", "init", "--tokenizer", (tmp / "tok").string(), "--output", (tmp / "model").string(),
               "--hidden", "64", "--layers", "2", "--heads", "4", "--kv-heads", "2", "--intermediate", "128",
               "--max-positions", "256", "--seed", "3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* f : {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
                        "generation_config.json"})
    EXPECT_TRUE(fs::exists(tmp / "model" / f)) << f;
  EXPECT_EQ(file_bytes(tmp / "model" / "tokenizer.json"), file_bytes(tmp / "tok" / "tokenizer.json"));

  auto hf = nlohmann::json::parse(rpg::test::run_oracle("model_init_check.py", {(tmp / "model").string()}).out);
  EXPECT_TRUE(hf["missing"].empty()) << hf["missing"].dump();
  EXPECT_TRUE(hf["unexpected"].empty()) << hf["unexpected"].dump();
  EXPECT_TRUE(hf["mismatched"].empty()) << hf["mismatched"].dump();
  EXPECT_EQ(hf["model_type"], "qwen2");
  EXPECT_TRUE(hf["tie"].get<bool>());

  auto config = rpg::model::ModelConfig::from_dir(tmp / "model");
  EXPECT_EQ(config.vocab_size, 1000);
  EXPECT_EQ(hf["num_parameters"].get<int64_t>(), config.num_parameters());
  rpg::tok::Tokenizer tok = rpg::tok::Tokenizer::from_dir(tmp / "model");
  EXPECT_EQ(hf["generation_eos"], nlohmann::json({*tok.token_to_id("<|im_end|>"), *tok.token_to_id("<|endoftext|>")}));
  ASSERT_EQ(hf["chat"].size(), 3u);
  for (const auto& c : hf["chat"]) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::parse(c["messages"].dump());
    EXPECT_EQ(tok.apply_chat_template(messages, c["add_generation_prompt"].get<bool>()), c["text"].get<std::string>());
  }
  auto ids = tok.encode(hf["chat"][0]["text"].get<std::string>());
  ASSERT_EQ(nlohmann::json(ids), hf["ids"]);

  auto model = rpg::model::CausalLM::from_pretrained(tmp / "model");
  std::vector<int64_t> ids64(ids.begin(), ids.end());
  at::Tensor input = at::tensor(ids64, at::kLong).unsqueeze(0);
  at::Tensor logits = model.forward(input)[0][-1].to(at::kFloat).contiguous();
  auto expect = hf["logits"].get<std::vector<float>>();
  ASSERT_EQ(logits.numel(), static_cast<int64_t>(expect.size()));
  at::Tensor ref = at::tensor(expect, at::kFloat);
  EXPECT_TRUE(at::allclose(logits, ref, 1e-4, 1e-4)) << (logits - ref).abs().max().item<float>();
}

struct Vocab {
  rpg::model::VocabInfo info{600, 599, 597};
};

void fake_tokenizer_dir(const fs::path& dir) {
  rpg::test::write_text(dir / "tokenizer.json", "{}");
  rpg::test::write_text(dir / "tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}");
  rpg::test::write_text(dir / "config.json", "not copied");
}

TEST(ModelInit, SameSeedSameBytesOtherSeedOtherWeights) {
  rpg::test::TempDir tmp;
  fake_tokenizer_dir(tmp / "tok");
  rpg::model::InitOptions o;
  o.hidden_size = 32;
  o.num_hidden_layers = 2;
  o.intermediate_size = 64;
  o.seed = 11;
  rpg::model::init_model_dir(o, Vocab{}.info, tmp / "tok", tmp / "a");
  rpg::model::init_model_dir(o, Vocab{}.info, tmp / "tok", tmp / "b");
  o.seed = 12;
  rpg::model::init_model_dir(o, Vocab{}.info, tmp / "tok", tmp / "c");
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(tmp / "a")) names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  EXPECT_EQ(names, (std::vector<std::string>{"config.json", "generation_config.json", "model.safetensors",
                                              "tokenizer.json", "tokenizer_config.json"}));
  for (const auto& n : names) EXPECT_EQ(file_bytes(tmp / "a" / n), file_bytes(tmp / "b" / n)) << n;
  EXPECT_EQ(file_bytes(tmp / "a" / "config.json"), file_bytes(tmp / "c" / "config.json"));
  EXPECT_NE(file_bytes(tmp / "a" / "model.safetensors"), file_bytes(tmp / "c" / "model.safetensors"));
  // Nothing but the three model directories and the tokenizer is left behind.
  size_t entries = 0;
  for (const auto& e : fs::directory_iterator(tmp.path())) entries += e.path().filename() != "" ? 1 : 0;
  EXPECT_EQ(entries, 4u);
}

TEST(ModelInit, DefaultsMakeASmallDemoModel) {
  rpg::model::InitOptions o;
  auto c = rpg::model::ModelConfig::from_json(rpg::model::init_config_json(o, {4096, 4095, 4093}), "defaults");
  EXPECT_GE(c.num_parameters(), 1000000);
  EXPECT_LE(c.num_parameters(), 5000000);
  EXPECT_TRUE(c.qkv_bias);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.head_dim, 32);
}

TEST(ModelInit, InconsistentShapesAreRejected) {
  auto bad = [](auto edit) {
    rpg::model::InitOptions o;
    rpg::model::VocabInfo v{600, 599, 597};
    edit(o, v);
    EXPECT_THROW(rpg::model::init_config_json(o, v), rpg::ValueError);
  };
  bad([](auto& o, auto&) { o.num_attention_heads = 3; });
  bad([](auto& o, auto&) { o.num_key_value_heads = 3; });
  bad([](auto& o, auto&) { o.hidden_size = 12; });  // head dim 3
  bad([](auto& o, auto&) { o.num_hidden_layers = 0; });
  bad([](auto&, auto& v) { v.eos_token_id = 600; });
  rpg::test::TempDir tmp;
  EXPECT_THROW(rpg::model::init_model_dir({}, {600, 599, 597}, tmp / "none", tmp / "out"), rpg::IoError);
  EXPECT_FALSE(fs::exists(tmp / "out"));
}

TEST(ModelInit, CliErrorsAreOneLine) {
  auto r = rpg_cmd({"model", "init", "--output", "/tmp/x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--tokenizer DIR is required"), std::string::npos) << r.err;
  rpg::test::TempDir tmp;
  r = rpg_cmd({"model", "init", "--tokenizer", (tmp / "missing").string(), "--output", (tmp / "m").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  r = rpg_cmd({"tokenizer", "train", "--corpus", (tmp / "missing.txt").string(), "--output", (tmp / "t").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("rpg: error:"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(tmp / "t"));
}

}  // namespace
