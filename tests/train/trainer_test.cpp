// The RL loop on a tiny chat model made by Hugging Face libraries, with an injected scorer:
// micro-batching never changes an update, and RL raises the reward of a learnable task.
#include "rpg/train/trainer.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "rpg/core/config.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"

#include <nlohmann/json.hpp>
#include <cmath>
#include <sstream>
#include "rpg/data/dataset.h"
#include "rpg/model/causal_lm.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace rpg::train {
namespace {

class TrainerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixture_ = test::oracle_output_dir("tiny_chat_model.py");
    dir_ = new test::TempDir();
    std::vector<data::Row> rows;
    for (int i = 0; i < 8; ++i) {
      data::Row r;
      r.data_source = "letters";
      r.prompt = {{"Write a word number " + std::to_string(i), "user"}};
      r.reward_model.ground_truth = "e";
      rows.push_back(r);
    }
    data::write_parquet(dir_->path() / "train.parquet", rows);
  }
  static void TearDownTestSuite() { delete dir_; }

  // Reward: the fraction of the response's characters that are the ground-truth letter,
  // scaled to [-1, 1] -- varied within every group, and learnable by a random model.
  static reward::ScorerRegistry scorers() {
    reward::ScorerRegistry r;
    r.add("letters", "test: frequency of one letter", [](std::string_view response, std::string_view gt) {
      double hits = 0;
      for (char c : response) hits += c == gt[0];
      reward::ScoreResult s;
      s.score = response.empty() ? -1.0 : 2.0 * hits / static_cast<double>(response.size()) - 1.0;
      s.acc = hits > 0;
      return s;
    });
    return r;
  }

  static TrainConfig config(const std::string& run) {
    TrainConfig c;
    c.actor_rollout_ref.model.path = (fixture_ / "model").string();
    c.actor_rollout_ref.model.enable_gradient_checkpointing = false;
    c.data.train_files = {(dir_->path() / "train.parquet").string()};
    c.data.train_batch_size = 4;
    c.data.max_prompt_length = 256;
    c.data.max_response_length = 12;
    c.actor_rollout_ref.rollout.n = 4;
    c.actor_rollout_ref.actor.ppo_mini_batch_size = 2;
    c.actor_rollout_ref.actor.policy_loss = "rpg_reinforce";
    c.actor_rollout_ref.actor.kl_form = "ufkl";
    c.actor_rollout_ref.actor.use_kl_loss = true;
    c.actor_rollout_ref.actor.kl_loss_coef = 1e-3;
    c.actor_rollout_ref.actor.clip_ratio_low = 0.2;
    c.actor_rollout_ref.actor.clip_ratio_high = 0.28;
    c.actor_rollout_ref.actor.optim.lr = 1e-3;
    c.algorithm.adv_estimator = "rpg";
    c.trainer.default_local_dir = (dir_->path() / run).string();
    c.trainer.device = "cpu";
    return c;
  }

  static fs::path fixture_;
  static test::TempDir* dir_;
};
fs::path TrainerTest::fixture_;
test::TempDir* TrainerTest::dir_ = nullptr;

// Adam's first steps move each weight by about lr * sign(gradient), which would hide a
// gradient-scale bug; the pre-clip gradient norms (actor/grad_norm, one per mini-batch)
// expose it. Weights must then agree to a small fraction of one step (lr = 1e-3): fp32
// summation order differs between micro-batch layouts.
TEST_F(TrainerTest, MicroBatchingNeverChangesTheUpdate) {
  std::vector<std::vector<at::Tensor>> params;
  std::vector<double> grad_norms;
  for (int variant = 0; variant < 3; ++variant) {
    TrainConfig c = config("micro" + std::to_string(variant));
    auto& a = c.actor_rollout_ref.actor;
    a.ppo_epochs = 2;
    if (variant == 0) a.ppo_micro_batch_size_per_gpu = 1;
    if (variant == 1) a.ppo_micro_batch_size_per_gpu = 8;
    if (variant == 2) {
      a.use_dynamic_bsz = true;
      a.ppo_max_token_len_per_gpu = 700;  // about 3 sequences of ~200 tokens
    }
    Trainer t(c, scorers());
    auto m = t.train_step();
    grad_norms.push_back(m.at("actor/grad_norm"));
    std::vector<at::Tensor> ps;
    for (const auto& p : t.model().parameters()) ps.push_back(p.detach().clone());
    params.push_back(std::move(ps));
    EXPECT_NE(m.at("critic/advantages/max"), 0.0);  // a real update, not a no-op
  }
  for (int variant = 1; variant < 3; ++variant) {
    EXPECT_NEAR(grad_norms[variant], grad_norms[0], 1e-5 * grad_norms[0]) << "variant " << variant;
    for (size_t i = 0; i < params[0].size(); ++i)
      EXPECT_LT((params[variant][i] - params[0][i]).abs().max().item<double>(), 1e-5)
          << "variant " << variant << " param " << i;
  }
}

TEST_F(TrainerTest, ReinforcementLearningRaisesTheReward) {
  TrainConfig c = config("learn");
  c.actor_rollout_ref.actor.optim.lr = 1e-2;
  c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 8;
  c.trainer.total_training_steps = 12;
  Trainer t(c, scorers());
  std::vector<double> scores;
  for (int s = 0; s < 12; ++s) scores.push_back(t.train_step().at("critic/score/mean"));
  const double first = (scores[0] + scores[1] + scores[2]) / 3, last = (scores[9] + scores[10] + scores[11]) / 3;
  EXPECT_GT(last, first + 0.2) << "first steps " << first << ", last steps " << last;
}

std::vector<double> scores_in(const fs::path& metrics_jsonl) {
  std::vector<double> out;
  std::istringstream in(read_file(metrics_jsonl));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("critic/score/mean")) out.push_back(j["critic/score/mean"].get<double>());
  }
  return out;
}

// A run stopped after a checkpoint and resumed (a new Trainer on the same run dir) ends
// with bit-identical weights and the same per-step metrics as an uninterrupted run.
TEST_F(TrainerTest, ResumeEqualsAnUninterruptedRun) {
  for (const std::string optim : {"adamw", "schedule_free_adamw"}) {
    auto make = [&](const std::string& run, int64_t steps) {
      TrainConfig c = config(run);
      c.actor_rollout_ref.actor.optim.optim_type = optim;
      c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 8;
      c.trainer.total_training_steps = steps;
      c.trainer.save_freq = 2;
      c.trainer.max_actor_ckpt_to_keep = 1;
      return c;
    };
    const std::string whole = "whole_" + optim, parts = "parts_" + optim;
    Trainer a(make(whole, 5), scorers());
    a.fit();
    {
      Trainer b(make(parts, 3), scorers());
      b.fit();
    }
    Trainer b2(make(parts, 5), scorers());
    EXPECT_EQ(b2.global_step(), 3);
    b2.fit();
    auto pa = a.model().named_parameters(), pb = b2.model().named_parameters();
    ASSERT_EQ(pa.size(), pb.size());
    for (size_t i = 0; i < pa.size(); ++i) EXPECT_TRUE(at::equal(pa[i].second, pb[i].second)) << optim << " " << pa[i].first;
    const fs::path run_a = dir_->path() / whole, run_b = dir_->path() / parts;
    EXPECT_EQ(scores_in(run_a / "metrics.jsonl"), scores_in(run_b / "metrics.jsonl")) << optim;
    EXPECT_EQ(scores_in(run_b / "metrics.jsonl").size(), 5u);
    // Only the newest checkpoint is kept; it is a loadable Hugging Face model directory.
    EXPECT_FALSE(fs::exists(run_b / "global_step_2"));
    EXPECT_FALSE(fs::exists(run_b / "global_step_3"));
    EXPECT_TRUE(fs::exists(run_b / "global_step_5" / "actor" / "model.safetensors"));
    EXPECT_EQ(read_file(run_b / "latest_checkpointed_iteration.txt"), "5\n");
  }
}

// A damaged newest checkpoint (truncated state file) is reported and the previous complete
// one is used.
TEST_F(TrainerTest, DamagedCheckpointFallsBackToThePreviousOne) {
  TrainConfig c = config("damaged");
  c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 8;
  c.trainer.total_training_steps = 3;
  c.trainer.save_freq = 1;
  {
    Trainer t(c, scorers());
    t.fit();
  }
  const fs::path run = dir_->path() / "damaged";
  const fs::path state = run / "global_step_3" / "train_state.safetensors";
  std::string bytes = read_file(state);
  test::write_text(state, bytes.substr(0, bytes.size() / 2));
  Trainer resumed(c, scorers());
  EXPECT_EQ(resumed.global_step(), 2);
  // Nothing intact at all is an error, not a silent fresh start.
  for (int step : {1, 2}) test::write_text(run / str("global_step_", step) / "train_state.json", "{");
  EXPECT_THROW(Trainer(c, scorers()), FormatError);
}

TEST_F(TrainerTest, ResumeRefusesAnIncompatibleConfig) {
  TrainConfig c = config("incompatible");
  c.trainer.total_training_steps = 1;
  {
    Trainer t(c, scorers());
    t.fit();
  }
  c.actor_rollout_ref.rollout.n = 2;
  try {
    Trainer t(c, scorers());
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("rollout_n was 4, the config now says 2"), std::string::npos) << e.what();
  }
  c.trainer.resume_mode = "disable";
  Trainer fresh(c, scorers());
  EXPECT_EQ(fresh.global_step(), 0);
}

TEST(KlControl, AdaptiveCoefficientMatchesVerl) {
  const std::vector<std::pair<double, int64_t>> updates = {{0.2, 64}, {0.05, 64}, {0.1, 128}, {3.0, 512}, {0.0, 32}};
  std::vector<std::string> args = {"0.001", "0.1", "10000"};
  for (const auto& [kl, n] : updates) args.push_back(std::to_string(kl) + ":" + std::to_string(n));
  std::istringstream ref(test::run_oracle("train_kl_ctrl.py", args).out);
  double coef = 0.001;
  for (const auto& [kl, n] : updates) {
    coef = adaptive_kl_coef(coef, kl, 0.1, 10000, n);
    double expected = 0;
    ref >> expected;
    EXPECT_NEAR(coef, expected, 1e-15 * expected) << "kl " << kl;
  }
}

// REINFORCE++: KL to the reference is folded into the token rewards; after the first update
// the policy has moved, so the penalty is positive and the adaptive coefficient moves.
TEST_F(TrainerTest, KlInRewardUsesAReferenceModel) {
  TrainConfig c = config("kl_in_reward");
  c.actor_rollout_ref.actor.policy_loss = "rfpp";
  c.algorithm.adv_estimator = "rfpp";
  c.algorithm.use_kl_in_reward = true;
  c.algorithm.kl_ctrl.type = "adaptive";
  c.algorithm.kl_ctrl.kl_coef = 0.01;
  c.actor_rollout_ref.actor.optim.lr = 1e-2;
  c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 8;
  Trainer t(c, scorers());
  auto first = t.train_step();
  EXPECT_NEAR(first.at("actor/reward_kl_penalty"), 0.0, 1e-6);  // the policy is still the reference
  auto second = t.train_step();
  EXPECT_GT(second.at("actor/reward_kl_penalty"), 1e-6);
  EXPECT_NE(second.at("actor/reward_kl_penalty_coeff"), 0.01);
}

TEST_F(TrainerTest, IterativeReferenceKeepsNoSecondModel) {
  TrainConfig c = config("iterative");
  c.actor_rollout_ref.actor.policy_loss = "grpo";
  c.algorithm.adv_estimator = "grpo";
  c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 8;
  c.actor_rollout_ref.actor.use_iterative_ref_model = true;
  c.actor_rollout_ref.actor.ppo_mini_batch_size = 4;  // one update per step: it is on-policy
  {
    Trainer t(c, scorers());
    EXPECT_FALSE(t.has_reference_model());
    auto m = t.train_step();
    // pi_ref = pi_old: the KL term starts at zero (the first mini-batch is on-policy).
    EXPECT_LT(std::abs(m.at("actor/kl_loss")), 1e-4);
  }
  c.trainer.default_local_dir = (dir_->path() / "fixed_ref").string();
  c.actor_rollout_ref.actor.use_iterative_ref_model = false;
  Trainer fixed(c, scorers());
  EXPECT_TRUE(fixed.has_reference_model());
  c.trainer.default_local_dir = (dir_->path() / "every_2").string();
  c.actor_rollout_ref.actor.use_iterative_ref_model = true;
  c.actor_rollout_ref.actor.ref_update_freq = 2;
  Trainer every2(c, scorers());
  EXPECT_TRUE(every2.has_reference_model());
}

// Dynamic sampling keeps only groups whose accuracy varies, and says so when it cannot.
TEST_F(TrainerTest, DynamicSamplingKeepsVaryingGroupsOrStops) {
  TrainConfig c = config("dynamic");
  c.algorithm.filter_groups.enable = true;
  c.algorithm.filter_groups.metric = "acc";
  c.algorithm.filter_groups.max_num_gen_batches = 3;
  c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 8;
  Trainer t(c, scorers());
  auto m = t.train_step();
  EXPECT_GE(m.at("train/num_gen_batches"), 1.0);
  EXPECT_LE(m.at("train/kept_group_ratio"), 1.0);
  // A scorer whose accuracy never varies within a group exhausts the generation budget.
  reward::ScorerRegistry constant;
  constant.add("letters", "always right", [](std::string_view, std::string_view) {
    reward::ScoreResult r;
    r.score = 1;
    r.acc = true;
    return r;
  });
  TrainConfig c2 = config("dynamic_exhausted");
  c2.algorithm.filter_groups = c.algorithm.filter_groups;
  Trainer t2(c2, std::move(constant));
  try {
    t2.train_step();
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("dynamic sampling: 3 generation batches gave only 0 of 4 groups"),
              std::string::npos)
        << e.what();
  }
}

// A non-finite reward makes every update non-finite: each is skipped (weights untouched)
// and the run stops after trainer.max_consecutive_skips of them.
TEST_F(TrainerTest, NonFiniteUpdatesAreSkippedThenStop) {
  reward::ScorerRegistry nan_scorer;
  nan_scorer.add("letters", "NaN", [](std::string_view, std::string_view) {
    reward::ScoreResult r;
    r.score = std::nan("");
    return r;
  });
  TrainConfig c = config("nan");
  c.trainer.max_consecutive_skips = 3;  // 2 mini-batches per step: the second step stops
  c.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu = 8;
  Trainer t(c, std::move(nan_scorer));
  std::vector<at::Tensor> before;
  for (const auto& p : t.model().parameters()) before.push_back(p.detach().clone());
  auto m = t.train_step();
  EXPECT_EQ(m.at("actor/skipped_steps"), 2.0);
  auto after = t.model().parameters();
  for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(at::equal(before[i], after[i])) << i;
  try {
    t.train_step();
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("3 optimizer steps in a row had a non-finite loss or gradient"),
              std::string::npos)
        << e.what();
  }
}

// Every recipe of the paper's matrix, shrunk to the tiny model, runs a full step with
// finite metrics.
TEST_F(TrainerTest, OneStepOfEveryRecipe) {
  size_t recipes = 0;
  for (const auto& e : fs::directory_iterator(test::source_dir() / "recipes")) {
    if (e.path().extension() != ".yaml") continue;
    ++recipes;
    const std::string name = e.path().stem().string();
    auto loaded = load_config<TrainConfig>(
        e.path(), {"actor_rollout_ref.model.path=" + (fixture_ / "model").string(),
                   "data.train_files=" + (dir_->path() / "train.parquet").string(), "data.val_files=[]",
                   "data.train_batch_size=2", "data.gen_batch_size=4", "data.max_prompt_length=256",
                   "data.max_response_length=8", "actor_rollout_ref.rollout.n=3",
                   "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=2048",
                   "reward_model.overlong_buffer.len=4", "actor_rollout_ref.model.enable_gradient_checkpointing=false",
                   "trainer.device=cpu", "trainer.default_local_dir=" + (dir_->path() / ("recipe_" + name)).string()});
    Trainer t(loaded.value, scorers());
    Metrics m = t.train_step();
    for (const auto& [k, v] : m) EXPECT_TRUE(std::isfinite(v)) << name << ": " << k << " = " << v;
    EXPECT_GT(m.at("actor/grad_norm"), 0.0) << name;
  }
  EXPECT_EQ(recipes, 24u);
}

TEST_F(TrainerTest, BadConfigurationIsAClearError) {
  TrainConfig c = config("bad");
  c.actor_rollout_ref.actor.policy_loss = "rpg_reinfroce";
  try {
    Trainer t(c, scorers());
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("actor_rollout_ref.actor.policy_loss: unknown name 'rpg_reinfroce'"),
              std::string::npos)
        << e.what();
  }
  c = config("bad2");
  c.data.train_batch_size = 64;
  c.actor_rollout_ref.actor.ppo_mini_batch_size = 64;
  EXPECT_THROW(Trainer(c, scorers()), ConfigError);
  c = config("bad3");
  EXPECT_THROW(Trainer(c, reward::ScorerRegistry()), ValueError);  // no scorer for data_source "letters"
}

}  // namespace
}  // namespace rpg::train
