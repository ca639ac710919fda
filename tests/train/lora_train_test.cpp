// `rpg train` with LoRA adapters (actor_rollout_ref.model.lora_rank > 0) on the tiny chat
// model made by Hugging Face libraries: only the adapters train (the base stays bit-identical,
// the optimizer holds state for the adapters alone); the fixed reference is the base model
// and no second model is resident; the iterative reference is the adapters of its last
// refresh; every checkpoint's actor/ is PEFT's adapter directory, which PEFT itself loads to
// the same logits (tests/oracles/model_lora_peft.py); a resumed run equals an uninterrupted
// one bit for bit; bf16 compute and rollout copies carry the adapters.
#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <gtest/gtest.h>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/data/dataset.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/lora.h"
#include "rpg/rollout/batch.h"
#include "rpg/train/trainer.h"
#include "rpg/train/trainer_testing.h"
#include "letters_task.h"
#include "tensor_file.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace rpg::train {
namespace {

class LoraTrainTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixture_ = test::oracle_output_dir("tiny_chat_model.py");
    dir_ = new test::TempDir();
    test_task::write_letters_data(dir_->path() / "train.parquet");
  }
  static void TearDownTestSuite() { delete dir_; }

  // Varied within every group, so every step has advantages and moves the adapters.
  static reward::ScorerRegistry scorers() { return test_task::letters_scorers(); }

  // GRPO with its KL loss to a fixed reference, LoRA rank 4 on every projection; 2 optimizer
  // steps per training step; lr high enough that the adapters move visibly.
  static TrainConfig config(const std::string& run) {
    TrainConfig c;
    c.actor_rollout_ref.model.path = base_dir().string();
    c.actor_rollout_ref.model.enable_gradient_checkpointing = false;
    c.actor_rollout_ref.model.lora_rank = 4;
    c.actor_rollout_ref.model.lora_alpha = 8;
    c.data.train_files = {(dir_->path() / "train.parquet").string()};
    c.data.train_batch_size = 4;
    c.data.max_prompt_length = 256;
    c.data.max_response_length = 12;
    c.actor_rollout_ref.rollout.n = 4;
    c.actor_rollout_ref.actor.ppo_mini_batch_size = 2;
    c.actor_rollout_ref.actor.policy_loss = "grpo";
    c.actor_rollout_ref.actor.use_kl_loss = true;
    c.actor_rollout_ref.actor.kl_loss_coef = 0.1;
    c.actor_rollout_ref.actor.optim.lr = 1e-2;
    c.algorithm.adv_estimator = "grpo";
    c.trainer.total_training_steps = 2;
    c.trainer.save_freq = 1;
    c.trainer.default_local_dir = (dir_->path() / run).string();
    c.trainer.device = "cpu";
    return c;
  }
  // KL in the reward to an iterative reference refreshed every 2 steps: the reference is a
  // snapshot of the adapters.
  static TrainConfig iterative_config(const std::string& run, int64_t steps) {
    TrainConfig c = config(run);
    c.actor_rollout_ref.actor.policy_loss = "vanilla";
    c.actor_rollout_ref.actor.use_kl_loss = false;
    c.actor_rollout_ref.actor.use_iterative_ref_model = true;
    c.actor_rollout_ref.actor.ref_update_freq = 2;
    c.algorithm.use_kl_in_reward = true;
    c.algorithm.kl_ctrl.kl_coef = 0.1;
    c.trainer.total_training_steps = steps;
    return c;
  }

  static fs::path base_dir() { return fixture_ / "model"; }
  static model::CausalLM base() { return model::CausalLM::from_pretrained(base_dir(), {at::kFloat, at::kCPU}); }
  // The base model with the adapter directory `adapter` attached.
  static model::CausalLM adapted(const fs::path& adapter) {
    model::CausalLM m = base();
    model::load_lora_adapter(m, adapter);
    return m;
  }
  // `m`'s log-probs of the batch's responses, as the trainer computes them (temperature 1).
  static at::Tensor log_probs(const model::CausalLM& m, const rollout::Batch& b) {
    c10::NoGradGuard no_grad;
    return m.log_probs(b.get("input_ids"), b.get("attention_mask"), b.get("position_ids"), b.get("responses")).log_probs;
  }
  static double max_diff_on_responses(const at::Tensor& a, const at::Tensor& b, const at::Tensor& mask) {
    return ((a - b).abs() * mask.to(at::kFloat)).max().item<double>();
  }
  static int64_t numel(const std::vector<std::pair<std::string, at::Tensor>>& ts) {
    int64_t n = 0;
    for (const auto& [name, t] : ts) n += t.numel();
    return n;
  }

  static fs::path fixture_;
  static test::TempDir* dir_;
};
fs::path LoraTrainTest::fixture_;
test::TempDir* LoraTrainTest::dir_ = nullptr;

TEST_F(LoraTrainTest, TrainsOnlyTheAdaptersAgainstTheBaseAsReference) {
  Trainer t(config("fixed"), scorers());
  EXPECT_FALSE(t.has_reference_model()) << "the fixed reference of a LoRA run is the policy's base, not a copy";
  t.fit();
  const model::CausalLM& policy = t.model();
  ASSERT_TRUE(policy.lora());
  EXPECT_EQ(policy.lora()->target_modules, model::lora_module_names()) << "target_modules defaults to all-linear";

  // The base is bit-identical to the files; every lora_B has moved away from its zero init.
  const model::CausalLM files = base();
  const auto want = files.named_parameters(), got = policy.named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i].second, want[i].second)) << got[i].first;
  const auto adapters = policy.lora_parameters();
  ASSERT_EQ(adapters.size(), 2 * 7 * static_cast<size_t>(policy.config().num_hidden_layers));
  for (const auto& [name, a] : adapters)
    if (name.find("lora_B") != std::string::npos) {
      EXPECT_GT(a.abs().max().item<double>(), 0.0) << name;
    }

  // The optimizer's state is AdamW's two moments of the adapters, nothing of the base.
  const OptimizerState os = TrainerTesting::optimizer_state(t);
  int64_t state = 0;
  for (const auto& [k, v] : os.tensors) {
    EXPECT_EQ(k.rfind("base_model.model.", 0), 0u) << k << ": optimizer state of a non-adapter tensor";
    state += v.numel();
  }
  EXPECT_EQ(state, 2 * numel(adapters));

  // The reference log-probs of the last step are the base model's.
  const rollout::Batch& b = t.last_batch();
  ASSERT_TRUE(b.has("ref_log_probs"));
  EXPECT_LE(max_diff_on_responses(b.get("ref_log_probs"), log_probs(files, b), b.get("response_mask")), 1e-5);

  // Each checkpoint's actor/ is PEFT's adapter directory holding the adapters of its step.
  const fs::path actor = dir_->path() / "fixed" / "global_step_2" / "actor";
  EXPECT_TRUE(fs::exists(actor / "adapter_config.json"));
  EXPECT_FALSE(fs::exists(actor / "model.safetensors")) << "a LoRA checkpoint holds no copy of the base";
  const model::CausalLM reloaded = adapted(actor);
  const auto back = reloaded.lora_parameters();
  ASSERT_EQ(back.size(), adapters.size());
  for (size_t i = 0; i < back.size(); ++i) EXPECT_TRUE(at::equal(back[i].second, adapters[i].second)) << back[i].first;
  // ... and a model with them computes the policy's log-probs.
  EXPECT_LE(max_diff_on_responses(log_probs(reloaded, b), log_probs(policy, b), b.get("response_mask")), 0.0);
}

// The accounted bytes (perf/memory/*): the optimizer's weights are the adapters (4 B each),
// its state AdamW's two moments of them (8 B each), the frozen base apart.
TEST_F(LoraTrainTest, MemoryMetricsCountTheAdaptersAsTheTrainedWeights) {
  Trainer t(config("memory"), scorers());
  const Metrics m = t.train_step();
  const int64_t adapter = numel(t.model().lora_parameters()), base_params = numel(t.model().named_parameters());
  EXPECT_EQ(m.at("perf/memory/weight_bytes"), 4.0 * static_cast<double>(adapter));
  EXPECT_EQ(m.at("perf/memory/optimizer_state_bytes"), 8.0 * static_cast<double>(adapter));
  EXPECT_EQ(m.at("perf/memory/frozen_weight_bytes"), 4.0 * static_cast<double>(base_params));
  EXPECT_LE(m.at("perf/memory/grad_bytes_max"), 4.0 * static_cast<double>(adapter)) << "a gradient of the base was kept";
}

// The rollout engine samples base + adapters (applied in its forward, nothing copied): after
// the adapters have moved, its log-probs of the step's responses equal the trainer's
// recomputed old log-probs within the engine's fp32 bound (tests/rollout/engine_test.cpp:
// 1e-4), and those differ from the base model's.
TEST_F(LoraTrainTest, RolloutLogProbsAreTheTrainersWithTheAdaptersOn) {
  Trainer t(config("rollout"), scorers());
  (void)t.train_step();
  const Metrics m = t.train_step();
  ASSERT_EQ(m.count("training/rollout_log_prob_diff_max"), 1u) << "the old log-probs were not recomputed";
  EXPECT_LT(m.at("training/rollout_log_prob_diff_max"), 1e-4);
  const rollout::Batch& b = t.last_batch();
  EXPECT_GT(max_diff_on_responses(b.get("old_log_probs"), log_probs(base(), b), b.get("response_mask")), 1e-3)
      << "the adapters did not change the policy";
}

// The iterative reference (KL in the reward, refreshed every 2 steps) at step 3 is the policy
// of step 2: the base with step 2's adapters, read back from that checkpoint.
TEST_F(LoraTrainTest, IterativeReferenceIsTheAdaptersOfItsLastRefresh) {
  Trainer t(iterative_config("iterative", 3), scorers());
  EXPECT_FALSE(t.has_reference_model());
  t.fit();
  const rollout::Batch& b = t.last_batch();
  ASSERT_TRUE(b.has("ref_log_probs"));
  const fs::path run = dir_->path() / "iterative";
  const at::Tensor mask = b.get("response_mask");
  EXPECT_LE(max_diff_on_responses(b.get("ref_log_probs"), log_probs(adapted(run / "global_step_2" / "actor"), b), mask),
            1e-5);
  // Not the base, nor step 1's adapters: the snapshot was refreshed once.
  EXPECT_GT(max_diff_on_responses(b.get("ref_log_probs"), log_probs(base(), b), mask), 1e-3);
  EXPECT_GT(max_diff_on_responses(b.get("ref_log_probs"), log_probs(adapted(run / "global_step_1" / "actor"), b), mask),
            1e-3);
}

// 2 steps, then a new process-like trainer resumes to 4: the checkpoint of step 4 (adapters,
// optimizer state, the reference snapshot) is byte-identical to an uninterrupted 4-step run's.
TEST_F(LoraTrainTest, ResumedRunEqualsAnUninterruptedOneBitForBit) {
  {
    Trainer whole(iterative_config("whole", 4), scorers());
    whole.fit();
  }
  {
    Trainer first(iterative_config("resumed", 2), scorers());
    first.fit();
  }
  Trainer second(iterative_config("resumed", 4), scorers());
  EXPECT_EQ(second.global_step(), 2);
  second.fit();
  const fs::path a = dir_->path() / "whole" / "global_step_4", b = dir_->path() / "resumed" / "global_step_4";
  EXPECT_EQ(read_file(a / "actor" / "adapter_model.safetensors"), read_file(b / "actor" / "adapter_model.safetensors"));
  EXPECT_EQ(read_file(a / "train_state.safetensors"), read_file(b / "train_state.safetensors"));
  const auto state = test::load_tensors(b / "train_state.safetensors");
  size_t ref = 0;
  for (const auto& [name, t] : state) {
    EXPECT_EQ(name.find("model.layers.0.self_attn.q_proj.weight"), std::string::npos) << name << ": the base was saved";
    ref += name.rfind("ref.base_model.model.", 0) == 0;
  }
  EXPECT_EQ(ref, second.model().lora_parameters().size()) << "the reference snapshot is checkpointed";
}

// A checkpoint cannot be resumed with other adapters (or none): one line naming the key.
TEST_F(LoraTrainTest, ResumeRefusesAnotherAdapterConfiguration) {
  { Trainer(config("refuse"), scorers()).fit(); }
  TrainConfig c = config("refuse");
  c.trainer.total_training_steps = 3;
  c.actor_rollout_ref.model.lora_rank = 8;
  try {
    Trainer t(c, scorers());
    FAIL() << "resumed with another rank";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("lora"), std::string::npos) << e.what();
  }
  c.actor_rollout_ref.model.lora_rank = 0;
  EXPECT_THROW(Trainer(c, scorers()), ConfigError) << "full fine-tuning from a LoRA checkpoint";
}

// PEFT's PeftModel.from_pretrained loads a checkpoint's actor/ onto the base model files and
// computes the logits rpg computes with the same adapters.
TEST_F(LoraTrainTest, PeftLoadsTheCheckpointedAdapter) {
  {
    TrainConfig c = config("peft");
    c.trainer.total_training_steps = 1;
    c.actor_rollout_ref.model.target_modules = {"q_proj", "v_proj", "down_proj"};
    Trainer t(c, scorers());
    t.fit();
    const rollout::Batch& b = t.last_batch();
    test::save_tensors(dir_->path() / "peft_batch.safetensors",
                       {{"input_ids", b.get("input_ids")},
                        {"attention_mask", b.get("attention_mask")},
                        {"position_ids", b.get("position_ids")}});
  }
  const fs::path actor = dir_->path() / "peft" / "global_step_1" / "actor";
  const fs::path out = dir_->path() / "peft_logits.safetensors";
  const auto r = test::run_oracle("model_lora_peft.py", {"logits", base_dir().string(), actor.string(),
                                                         (dir_->path() / "peft_batch.safetensors").string(), out.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto batch = test::load_tensors(dir_->path() / "peft_batch.safetensors");
  const at::Tensor peft = test::load_tensors(out).at("logits");
  const model::CausalLM m = adapted(actor);
  EXPECT_EQ(m.lora()->target_modules, (std::vector<std::string>{"q_proj", "v_proj", "down_proj"}));
  c10::NoGradGuard no_grad;
  const at::Tensor ours = m.forward(batch.at("input_ids"), batch.at("attention_mask"), batch.at("position_ids"));
  const at::Tensor mask = batch.at("attention_mask").to(at::kFloat).unsqueeze(-1);
  EXPECT_LE(((ours - peft).abs() * mask).max().item<double>(), 1e-5);
}

// bf16 compute (the policy is a bf16 base with fp32 adapters, PEFT's default for bf16 models:
// no copy; it samples itself) and a bf16 rollout copy beside fp32 compute (it carries fp32
// adapters, refreshed after every optimizer step): the base stays frozen, and the rollout
// samples with the adapters of the last optimizer step.
TEST_F(LoraTrainTest, Bf16ComputeAndRolloutCopiesCarryTheAdapters) {
  for (const bool bf16_compute : {true, false}) {
    const std::string run = bf16_compute ? "bf16_compute" : "bf16_rollout";
    TrainConfig c = config(run);
    if (bf16_compute) c.actor_rollout_ref.actor.compute_dtype = "bfloat16";
    else c.actor_rollout_ref.rollout.dtype = "bfloat16";
    Trainer t(c, scorers());
    (void)t.train_step();
    TrainerTesting::record_updates(t, true);
    const Metrics m = t.train_step();
    EXPECT_TRUE(std::isfinite(m.at("actor/pg_loss"))) << run;
    const auto adapters = t.model().lora_parameters();
    for (const auto& [name, a] : adapters)
      if (name.find("lora_B") != std::string::npos) {
        EXPECT_GT(a.abs().max().item<double>(), 0.0) << run << " " << name;
      }
    const model::CausalLM files =
        model::CausalLM::from_pretrained(base_dir(), {bf16_compute ? at::kBFloat16 : at::kFloat, at::kCPU});
    const auto want = files.named_parameters(), got = t.model().named_parameters();
    EXPECT_EQ(t.model().dtype(), bf16_compute ? at::kBFloat16 : at::kFloat) << run;
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i].second, want[i].second)) << run << " " << got[i].first;
    for (const auto& [name, a] : adapters) EXPECT_EQ(a.scalar_type(), at::kFloat) << run << " " << name;
    // The step's sampling weights end with the rollout model's adapters: those the update
    // before left (the first optimizer step of this step started from them), fp32 as theirs.
    const auto& sampling = TrainerTesting::last_sampling_weights(t);
    const auto& updates = TrainerTesting::last_updates(t);
    ASSERT_FALSE(sampling.empty());
    ASSERT_FALSE(updates.empty());
    const auto& w = sampling.front();
    ASSERT_EQ(w.size(), want.size() + adapters.size()) << run;
    for (size_t i = 0; i < adapters.size(); ++i) {
      const at::Tensor& sampled = w[want.size() + i];
      EXPECT_TRUE(at::equal(sampled, updates.front().weights[i])) << run << " " << adapters[i].first;
    }
  }
}

// Schedule-free AdamW over the adapters (paper semantics; the fork's own optimizer): the base
// stays bit-identical, every lora_B moves, the optimizer's state is the adapters' alone, and
// the checkpoint holds a loadable adapter of the same tensors.
TEST_F(LoraTrainTest, ScheduleFreeTrainsTheAdaptersOnly) {
  TrainConfig c = config("schedule_free");
  c.actor_rollout_ref.actor.optim.optim_type = "schedule_free_adamw";
  Trainer t(c, scorers());
  t.fit();
  const model::CausalLM files = base();
  const auto want = files.named_parameters(), got = t.model().named_parameters();
  for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i].second, want[i].second)) << got[i].first;
  const auto adapters = t.model().lora_parameters();
  for (const auto& [name, a] : adapters) {
    if (name.find("lora_B") != std::string::npos) {
      EXPECT_GT(a.abs().max().item<double>(), 0.0) << name;
    }
  }
  for (const auto& [k, v] : TrainerTesting::optimizer_state(t).tensors)
    EXPECT_EQ(k.rfind("base_model.model.", 0), 0u) << k << ": optimizer state of a non-adapter tensor";
  const auto saved = adapted(dir_->path() / "schedule_free" / "global_step_2" / "actor").lora_parameters();
  ASSERT_EQ(saved.size(), adapters.size());
  for (size_t i = 0; i < saved.size(); ++i) EXPECT_EQ(saved[i].first, adapters[i].first);
}

// Invalid LoRA settings: one line naming the key.
TEST_F(LoraTrainTest, BadSettingsAreRefusedByKey) {
  auto refused = [&](const std::function<void(TrainConfig&)>& edit, const std::string& key) {
    TrainConfig c = config("bad");
    edit(c);
    try {
      (void)c.resolve();
      c.validate();
      ADD_FAILURE() << key << ": accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  };
  const std::string m = "actor_rollout_ref.model.";
  refused([](TrainConfig& c) { c.actor_rollout_ref.model.lora_rank = -1; }, m + "lora_rank");
  refused([](TrainConfig& c) { c.actor_rollout_ref.model.lora_alpha = 0; }, m + "lora_alpha");
  refused([](TrainConfig& c) { c.actor_rollout_ref.model.lora_dropout = 0.05; }, m + "lora_dropout");
  refused([](TrainConfig& c) { c.actor_rollout_ref.model.target_modules = {"q_proj", "qkv"}; }, m + "target_modules");
  refused([](TrainConfig& c) { c.actor_rollout_ref.model.target_modules = {"all-linear", "q_proj"}; },
          m + "target_modules");
  refused([](TrainConfig& c) { c.actor_rollout_ref.model.target_modules = {"v_proj", "v_proj"}; }, m + "target_modules");
  refused([](TrainConfig& c) { c.actor_rollout_ref.model.target_modules = {}; }, m + "target_modules");
  refused(
      [](TrainConfig& c) {
        c.actor_rollout_ref.actor.compute_dtype = "bfloat16";
        c.dist.zero_stage = 1;
        c.dist.shard_master_weights = true;
      },
      "dist.shard_master_weights");
}

}  // namespace
}  // namespace rpg::train
