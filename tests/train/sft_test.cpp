// SFT on a tiny chat model made by Hugging Face libraries: the loss and one AdamW update
// equal transformers' own, micro-batching never changes them, training memorises a few
// pairs well enough to generate them greedily, and bad input names its file and line.
#include "rpg/train/sft.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/model/causal_lm.h"
#include "rpg/rollout/engine.h"
#include "rpg/rollout/policy.h"
#include "rpg/train/checkpoint.h"
#include "rpg/train/optim.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace rpg::train {
namespace {

std::string jsonl(const std::vector<SftPair>& pairs) {
  std::string out;
  for (const auto& p : pairs) out += nlohmann::json{{"prompt", p.prompt}, {"response", p.response}}.dump() + "\n";
  return out;
}

// Lengths differ so that padding (left for prompts, right for responses) is exercised.
const std::vector<SftPair> kPairs = {
    {"What is 2 + 3?", "2 + 3 = 5. Answer: 5"},
    {"Name a colour.", "Blue."},
    {"Count to four, please, and say nothing else at all.", "one two three four"},
};

class SftTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixture_ = test::oracle_output_dir("tiny_chat_model.py");
    dir_ = new test::TempDir();
    test::write_text(dir_->path() / "pairs.jsonl", jsonl(kPairs));
  }
  static void TearDownTestSuite() { delete dir_; }
  static fs::path model_dir() { return fixture_ / "model"; }

  static std::vector<const SftExample*> pointers(const std::vector<SftExample>& v) {
    std::vector<const SftExample*> out;
    for (const auto& e : v) out.push_back(&e);
    return out;
  }

  static fs::path fixture_;
  static test::TempDir* dir_;
};
fs::path SftTest::fixture_;
test::TempDir* SftTest::dir_ = nullptr;

TEST_F(SftTest, LossAndGradientMatchTransformers) {
  const fs::path grads = dir_->path() / "oracle_grads.safetensors";
  auto r = test::run_oracle("train_sft_loss.py",
                            {model_dir().string(), (dir_->path() / "pairs.jsonl").string(), grads.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ref = nlohmann::json::parse(r.out);

  auto policy = rollout::load_policy(model_dir(), "float32", "cpu");
  auto examples = encode_sft_pairs(policy, read_sft_jsonl(dir_->path() / "pairs.jsonl"));
  ASSERT_EQ(examples.size(), kPairs.size());
  for (size_t i = 0; i < examples.size(); ++i) {
    EXPECT_EQ(examples[i].prompt_ids, ref["prompt_ids"][i].get<std::vector<int64_t>>()) << i;
    EXPECT_EQ(examples[i].response_ids, ref["response_ids"][i].get<std::vector<int64_t>>()) << i;
  }

  const auto res = sft_backward(policy.model, pointers(examples), policy.pad_token_id, 2);
  EXPECT_EQ(res.tokens, ref["tokens"].get<int64_t>());
  const double want = ref["loss"].get<double>();
  EXPECT_NEAR(res.loss, want, 1e-5 * std::abs(want)) << "loss " << res.loss << " vs transformers " << want;
  const auto params = policy.model.named_parameters();
  const double norm = clip_grad_norm(params, 1e30);
  const double want_norm = ref["grad_norm"].get<double>();
  EXPECT_NEAR(norm, want_norm, 1e-5 * want_norm) << "grad norm " << norm << " vs " << want_norm;

  // Every parameter's gradient, so an update from it is transformers' update.
  auto theirs = load_tensor_file(grads);
  EXPECT_EQ(theirs.size(), params.size());
  double worst = 0;
  for (const auto& [name, p] : params) {
    auto it = theirs.find(name);
    ASSERT_NE(it, theirs.end()) << name;
    ASSERT_TRUE(p.grad().defined()) << name;
    worst = std::max(worst, (p.grad() - it->second).abs().max().item<double>());
  }
  EXPECT_LT(worst, 1e-5 * want_norm) << "largest gradient difference";
}

TEST_F(SftTest, MicroBatchesDoNotChangeLossOrGradient) {
  auto policy = rollout::load_policy(model_dir(), "float32", "cpu");
  auto examples = encode_sft_pairs(policy, kPairs);
  const auto params = policy.model.named_parameters();
  auto run = [&](int64_t micro, std::vector<at::Tensor>* grads) {
    for (const auto& [name, p] : params) p.mutable_grad() = at::Tensor();
    auto r = sft_backward(policy.model, pointers(examples), policy.pad_token_id, micro);
    for (const auto& [name, p] : params) grads->push_back(p.grad().clone());
    return r;
  };
  std::vector<at::Tensor> g1, g3;
  auto one = run(1, &g1);
  auto all = run(3, &g3);
  EXPECT_EQ(one.tokens, all.tokens);
  EXPECT_NEAR(one.loss, all.loss, 1e-5 * std::abs(all.loss));
  double n1 = 0, n3 = 0, diff = 0;
  for (size_t i = 0; i < g1.size(); ++i) {
    n1 += g1[i].pow(2).sum().item<double>();
    n3 += g3[i].pow(2).sum().item<double>();
    diff += (g1[i] - g3[i]).pow(2).sum().item<double>();
  }
  EXPECT_NEAR(std::sqrt(n1), std::sqrt(n3), 1e-5 * std::sqrt(n3));
  EXPECT_LT(std::sqrt(diff), 1e-5 * std::sqrt(n3)) << "gradients differ between micro-batch sizes";
}

TEST_F(SftTest, MemorisesPairsAndGeneratesThemGreedily) {
  const std::vector<SftPair> pairs = {
      {"First word?", "apple"},
      {"Second word?", "banana split"},
      {"Third word?", "cherry pie"},
      {"Fourth word?", "date"},
  };
  test::write_text(dir_->path() / "memo.jsonl", jsonl(pairs));
  SftOptions o;
  o.lr = 3e-3;
  o.steps = 80;
  o.batch_size = 4;
  o.micro_batch_size = 2;
  o.device = "cpu";
  o.progress = false;
  const fs::path out = dir_->path() / "memo_run";
  auto result = run_sft(model_dir(), dir_->path() / "memo.jsonl", out, o);
  EXPECT_EQ(result.steps, 80);
  EXPECT_EQ(result.pairs, 4);
  EXPECT_EQ(result.dropped, 0);
  EXPECT_GT(result.first_loss, 3.0) << "a random model should not know the responses";
  EXPECT_LT(result.last_loss, 0.05) << "first loss " << result.first_loss;

  // One metrics line per step, with the SFT metrics.
  std::istringstream lines(read_file(out / "metrics.jsonl"));
  std::string line;
  int64_t n = 0;
  while (std::getline(lines, line)) {
    auto j = nlohmann::json::parse(line);
    ++n;
    for (const char* k : {"sft/loss", "sft/lr", "sft/grad_norm", "sft/tokens"}) EXPECT_TRUE(j.contains(k)) << k;
  }
  EXPECT_EQ(n, 80);
  EXPECT_TRUE(fs::exists(out / "model" / "tokenizer.json"));
  EXPECT_TRUE(fs::exists(out / "model" / "tokenizer_config.json"));

  auto policy = rollout::load_policy(result.model_dir, "float32", "cpu");
  std::vector<std::vector<int64_t>> prompts;
  for (const auto& p : pairs) prompts.push_back(rollout::render_prompt(policy.tokenizer, {{"user", p.prompt}}));
  rollout::SamplingParams sp;
  sp.temperature = 0.0;
  sp.max_new_tokens = 16;
  sp.stop_token_ids = policy.stop_token_ids;
  rollout::RolloutEngine engine(policy.model);
  auto responses = engine.generate(prompts, sp);
  ASSERT_EQ(responses.size(), pairs.size());
  for (size_t i = 0; i < pairs.size(); ++i) {
    std::vector<tok::TokenId> ids(responses[i].token_ids.begin(), responses[i].token_ids.end());
    EXPECT_EQ(policy.tokenizer.decode(ids, /*skip_special_tokens=*/true), pairs[i].response) << pairs[i].prompt;
    EXPECT_EQ(responses[i].finish_reason, rollout::FinishReason::kStop) << "the model must learn to stop";
  }
}

// The early stop asks only at its checkpoints (every eval_every steps, from min_steps on),
// sees the weights that are then saved, and ends training at the first yes.
TEST_F(SftTest, StopWhenEndsTrainingAtTheFirstYesAndSavesThoseWeights) {
  SftOptions o;
  o.lr = 1e-3;
  o.steps = 12;
  o.batch_size = 2;
  o.micro_batch_size = 2;
  o.device = "cpu";
  o.progress = false;
  o.eval_every = 2;
  o.min_steps = 3;
  std::vector<int64_t> asked;
  std::vector<at::Tensor> seen;
  o.stop_when = [&](const rollout::Policy& policy, int64_t step) {
    asked.push_back(step);
    seen.clear();
    for (const auto& p : policy.model.parameters()) seen.push_back(p.detach().clone());
    return step == 6;
  };
  const fs::path out = dir_->path() / "early_stop";
  auto result = run_sft(model_dir(), dir_->path() / "pairs.jsonl", out, o);
  EXPECT_EQ(asked, (std::vector<int64_t>{4, 6}));
  EXPECT_EQ(result.steps, 6);
  EXPECT_TRUE(result.stopped_early);
  std::istringstream metrics(read_file(out / "metrics.jsonl"));
  std::string line;
  int64_t lines = 0;
  while (std::getline(metrics, line)) ++lines;
  EXPECT_EQ(lines, 6);
  auto saved = model::CausalLM::from_pretrained(result.model_dir);
  const auto params = saved.parameters();
  ASSERT_EQ(params.size(), seen.size());
  for (size_t i = 0; i < params.size(); ++i) EXPECT_TRUE(at::equal(params[i], seen[i])) << "parameter " << i;

  // Never yes: every step runs, and the run is not reported as stopped early.
  asked.clear();
  o.stop_when = [&](const rollout::Policy&, int64_t step) {
    asked.push_back(step);
    return false;
  };
  result = run_sft(model_dir(), dir_->path() / "pairs.jsonl", dir_->path() / "no_stop", o);
  EXPECT_EQ(asked, (std::vector<int64_t>{4, 6, 8, 10, 12}));
  EXPECT_EQ(result.steps, 12);
  EXPECT_FALSE(result.stopped_early);
}

TEST_F(SftTest, CommandLineTrainsAndSavesAModel) {
  const fs::path out = dir_->path() / "cli_run";
  auto r = test::run_process({test::rpg_binary().string(), "sft", "--model", model_dir().string(), "--data",
                              (dir_->path() / "pairs.jsonl").string(), "--output", out.string(), "--steps", "3",
                              "--batch-size", "2", "--micro-batch-size", "1", "--lr", "1e-3", "--max-length", "100",
                              "--device", "cpu", "--no-progress"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(fs::exists(out / "model" / "config.json"));
  EXPECT_TRUE(fs::exists(out / "model" / "tokenizer.json"));
  EXPECT_NE(r.err.find("dropped 1 of 3 pairs"), std::string::npos) << r.err;
  auto trained = model::CausalLM::from_pretrained(out / "model");
  auto original = model::CausalLM::from_pretrained(model_dir());
  const auto a = trained.named_parameters(), b = original.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  EXPECT_FALSE(at::equal(a[0].second, b[0].second)) << "the saved model must be the trained one";
}

TEST_F(SftTest, BadJsonlNamesFileAndLine) {
  auto expect_error = [&](const std::string& text, const std::string& what) {
    const fs::path f = dir_->path() / "bad.jsonl";
    test::write_text(f, text);
    try {
      read_sft_jsonl(f);
      ADD_FAILURE() << "no error for: " << text;
    } catch (const FormatError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  const std::string good = R"({"prompt": "a", "response": "b"})";
  const std::string f = (dir_->path() / "bad.jsonl").string();
  expect_error(good + "\n{not json\n", f + ":2: not valid JSON");
  expect_error(good + "\n\n" + R"({"prompt": "a"})" + "\n", f + ":3: missing \"response\"");
  expect_error(R"({"prompt": 1, "response": "b"})", f + ":1: \"prompt\" must be a string");
  expect_error(R"(["prompt", "response"])", f + ":1: expected a JSON object");
  expect_error("\n\n", f + ": no (prompt, response) pairs");

  // The command fails with one line naming the file and line, exit code 1.
  test::write_text(dir_->path() / "bad.jsonl", good + "\n" + good + "\n{\"prompt\": \"x\", \"response\": null}\n");
  auto r = test::run_process({test::rpg_binary().string(), "sft", "--model", model_dir().string(), "--data", f,
                              "--output", (dir_->path() / "bad_run").string(), "--device", "cpu"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("rpg: error: " + f + ":3: \"response\" must be a string"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(dir_->path() / "bad_run" / "model"));
}

}  // namespace
}  // namespace rpg::train
