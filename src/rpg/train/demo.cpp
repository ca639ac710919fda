#include "rpg/train/demo.h"

#include <ATen/Parallel.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/log.h"
#include "rpg/core/config.h"
#include "rpg/data/dataset.h"
#include "rpg/data/prepare.h"
#include "rpg/data/synth.h"
#include "rpg/eval/evaluate.h"
#include "rpg/eval/report.h"
#include "rpg/model/init.h"
#include "rpg/reward/registry.h"
#include "rpg/rollout/policy.h"
#include "rpg/tokenizer/bpe_trainer.h"
#include "rpg/tokenizer/tokenizer.h"
#include "rpg/train/config.h"
#include "rpg/train/sft.h"
#include "rpg/train/trainer.h"

namespace fs = std::filesystem;

namespace rpg::train {
namespace {

using Clock = std::chrono::steady_clock;

double test_accuracy(const fs::path& model_dir, const fs::path& test_file, const DemoOptions& o) {
  auto policy = rollout::load_policy(model_dir, "float32", "cpu");
  rollout::SamplingParams sp;
  sp.temperature = 1.0;
  sp.n = o.eval_n;
  sp.max_new_tokens = o.max_response_tokens;
  sp.seed = o.seed;
  auto result = eval::evaluate(policy, data::read_parquet(test_file), sp, {64, 0}, reward::builtin_scorers(), o.progress);
  return result.metrics.at("math_dapo").at(str("acc/mean@", o.eval_n));
}

}  // namespace

DemoResult run_demo(DemoOptions o) {
  if (o.quick) {
    o.train_problems = 64, o.test_problems = 16, o.sft_steps = 4, o.rl_steps = 2, o.rl_prompts = 4, o.rl_n = 2;
    o.eval_n = 1, o.max_response_tokens = 16;
  }
  const auto t0 = Clock::now();
  const fs::path out = o.out_dir, data_dir = out / "data", tok_dir = out / "tokenizer", init_dir = out / "model_init",
                 sft_dir = out / "sft", rl_dir = out / "rl";
  fs::create_directories(out);
  auto stage = [&](const std::string& what) {
    log_info(str("demo [", static_cast<int64_t>(std::chrono::duration<double>(Clock::now() - t0).count()), " s] ",
                 what));
  };

  stage("1/7 synthetic problems");
  data::SynthOptions so;
  so.seed = o.seed;
  so.train = o.train_problems;
  so.validation = std::max<int64_t>(8, o.test_problems / 4);
  so.test = o.test_problems;
  so.max_difficulty = o.max_difficulty;
  const auto splits = data::synth_splits(so);
  data::write_synth(data_dir, splits, {});

  stage("2/7 tokenizer (byte-level BPE on the training text)");
  std::string corpus;
  for (const auto& p : splits.train) corpus += data::apply_prompt_template(p.problem) + "\n" + p.solution + "\n";
  write_file_atomic(out / "corpus.txt", corpus);
  tok::BpeTrainerOptions bo;
  bo.vocab_size = 1024;
  bo.chat_template = "chatml";  // no default system prompt: shorter prompts for a small model
  tok::train_bpe_files({out / "corpus.txt"}, tok_dir, bo);

  stage("3/7 model initialised from scratch");
  Tokenizer tok = Tokenizer::from_dir(tok_dir);
  model::InitOptions mo;
  mo.seed = o.seed;
  mo.hidden_size = 128;
  mo.num_hidden_layers = 4;
  mo.intermediate_size = 384;
  mo.max_position_embeddings = 512;
  model::init_model_dir(mo, {static_cast<int64_t>(tok.vocab_size()), *tok.eos_id(), tok.pad_id().value_or(*tok.eos_id())},
                        tok_dir, init_dir);

  stage("4/7 SFT warm start on worked solutions");
  SftOptions sft;
  sft.lr = 3e-3;
  sft.batch_size = 16;
  sft.micro_batch_size = 16;
  sft.steps = o.sft_steps;
  sft.seed = static_cast<int64_t>(o.seed);
  sft.device = "cpu";
  sft.progress = o.progress;
  const auto sft_result = run_sft(init_dir, data_dir / data::synth_sft_name("train"), sft_dir, sft);

  stage("5/7 evaluation of the SFT model on the held-out test split");
  DemoResult r;
  r.before = test_accuracy(sft_result.model_dir, data_dir / data::synth_parquet_name("test"), o);
  log_info(str("demo: SFT model test mean@", o.eval_n, " = ", r.before));

  stage("6/7 RL: RPG-REINFORCE-UFKL, RPG-Style Clip (0.2, 0.28), iterative reference, dynamic sampling");
  TrainConfig c;
  c.actor_rollout_ref.model.path = sft_result.model_dir.string();
  c.actor_rollout_ref.model.enable_gradient_checkpointing = false;
  c.data.train_files = {(data_dir / data::synth_parquet_name("train")).string()};
  c.data.val_files = {(data_dir / data::synth_parquet_name("validation")).string()};
  c.data.train_batch_size = o.rl_prompts;
  c.data.gen_batch_size = o.rl_prompts * 2;
  c.data.max_prompt_length = 256;
  c.data.max_response_length = o.max_response_tokens;
  c.actor_rollout_ref.rollout.n = o.rl_n;
  c.actor_rollout_ref.rollout.val_kwargs.n = 1;
  auto& a = c.actor_rollout_ref.actor;
  a.policy_loss = "rpg_reinforce";
  a.kl_form = "ufkl";
  a.rpg_style_clip = true;
  a.clip_ratio_low = 0.2;
  a.clip_ratio_high = 0.28;
  a.use_kl_loss = true;
  a.kl_loss_coef = 1e-4;
  a.use_iterative_ref_model = true;
  a.ppo_mini_batch_size = std::max<int64_t>(1, o.rl_prompts / 2);
  a.ppo_micro_batch_size_per_gpu = o.rl_prompts * o.rl_n;
  a.optim.lr = 1e-3;
  a.optim.weight_decay = 0.0;
  c.algorithm.adv_estimator = "rpg";
  // The quick smoke test's barely trained model solves nothing, so no group would survive.
  c.algorithm.filter_groups.enable = !o.quick;
  c.algorithm.filter_groups.metric = "acc";
  // A weak warm start solves few problems, so few groups vary: allow many generation batches.
  c.algorithm.filter_groups.max_num_gen_batches = 40;
  c.trainer.total_training_steps = o.rl_steps;
  c.trainer.test_freq = std::max<int64_t>(1, o.rl_steps / 3);
  c.trainer.save_freq = -1;
  c.trainer.default_local_dir = rl_dir.string();
  c.trainer.device = "cpu";
  c.trainer.seed = static_cast<int64_t>(o.seed);
  c.trainer.sample_log_freq = std::max<int64_t>(1, o.rl_steps / 5);
  write_file_atomic(rl_dir / "config.yaml", config_to_yaml(c));
  {
    Trainer trainer(c, reward::builtin_scorers());
    trainer.fit();
  }

  stage("7/7 evaluation after RL");
  const fs::path final_model = rl_dir / str("global_step_", o.rl_steps) / "actor";
  r.after = test_accuracy(final_model, data_dir / data::synth_parquet_name("test"), o);
  r.report = eval::write_report(rl_dir);
  nlohmann::json summary = {{"seed", o.seed},
                            {"test_problems", o.test_problems},
                            {"eval", str("mean@", o.eval_n)},
                            {"sft_accuracy", r.before},
                            {"rl_accuracy", r.after},
                            {"improvement_points", 100.0 * (r.after - r.before)},
                            {"wall_seconds", std::chrono::duration<double>(Clock::now() - t0).count()},
                            {"report", r.report.string()},
                            {"final_model", final_model.string()}};
  write_file_atomic(out / "summary.json", summary.dump(2) + "\n");
  return r;
}

}  // namespace rpg::train
