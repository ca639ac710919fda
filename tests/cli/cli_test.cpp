// `rpg` run as a subprocess: exit codes, one-line errors, help and config output.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <set>

#include "rpg/core/config.h"

#include "test_util.h"

namespace rpg {
namespace {

using test::ProcessResult;

ProcessResult rpg(std::vector<std::string> args) {
  args.insert(args.begin(), test::rpg_binary().string());
  return test::run_process(args);
}

size_t count_lines(const std::string& s) { return static_cast<size_t>(std::count(s.begin(), s.end(), '\n')); }

// A failure is exactly one line on stderr, starting "rpg: error: ", and no stack trace.
void expect_one_line_error(const ProcessResult& r, int code, const std::string& fragment) {
  EXPECT_EQ(r.exit_code, code) << r.err;
  EXPECT_EQ(count_lines(r.err), 1u) << r.err;
  EXPECT_EQ(r.err.rfind("rpg: error: ", 0), 0u) << r.err;
  EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
}

TEST(Cli, HelpListsCommands) {
  ProcessResult r = rpg({"--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("usage: rpg <command>"), std::string::npos);
  EXPECT_NE(r.out.find("config show"), std::string::npos);
  EXPECT_TRUE(r.err.empty()) << r.err;
}

TEST(Cli, NoArgumentsIsUsageError) {
  ProcessResult r = rpg({});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.out.find("usage: rpg"), std::string::npos);
}

TEST(Cli, VersionNamesRpgAndLibtorch) {
  ProcessResult r = rpg({"--version"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_EQ(r.out.rfind("rpg ", 0), 0u) << r.out;
  EXPECT_NE(r.out.find("libtorch 2."), std::string::npos) << r.out;
}

TEST(Cli, UnknownCommandSuggests) {
  expect_one_line_error(rpg({"confg"}), 2, "unknown command 'confg'; did you mean 'config'?");
  expect_one_line_error(rpg({"config"}), 2, "'rpg config' needs a subcommand: 'rpg config show'");
}

TEST(Cli, CommandHelp) {
  ProcessResult r = rpg({"config", "show", "--help"});
  EXPECT_EQ(r.exit_code, 0);
  EXPECT_NE(r.out.find("usage: rpg config show"), std::string::npos) << r.out;
}

// `rpg config show --help` lists every policy loss with its registry description and what it
// needs (a reference model only for a KL loss towards pi_ref).
TEST(Cli, ConfigShowHelpListsThePolicyLosses) {
  ProcessResult r = rpg({"config", "show", "--help"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* name : {"vanilla", "dapo", "grpo", "grpo_corrected", "gspo", "cispo", "rpg", "rpg_reinforce"})
    EXPECT_NE(r.out.find(std::string("\n  ") + name + " "), std::string::npos) << name << "\n" << r.out;
  auto line_of = [&](const std::string& name) {
    const size_t at = r.out.find("\n  " + name + " ");
    return at == std::string::npos ? std::string() : r.out.substr(at + 1, r.out.find('\n', at + 1) - at - 1);
  };
  EXPECT_NE(line_of("grpo").find("[use_kl_loss: reference model]"), std::string::npos) << line_of("grpo");
  EXPECT_EQ(line_of("rpg").find("reference model"), std::string::npos) << line_of("rpg");
  EXPECT_NE(line_of("rpg").find("Alg. 1"), std::string::npos) << line_of("rpg");
}

TEST(Cli, UnknownFlagIsUsageError) {
  expect_one_line_error(rpg({"config", "show", "--bogus"}), 2, "unknown option '--bogus'");
}

TEST(Cli, ConfigShowPrintsDefaultsAndOverrides) {
  test::TempDir dir;
  test::write_text(dir / "run.yaml",
                   "data:\n  train_batch_size: 64\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 32\n");
  ProcessResult r = rpg({"config", "show", (dir / "run.yaml").string(), "actor_rollout_ref.actor.optim.lr=5e-7",
                         "actor_rollout_ref.rollout.n=16", "trainer.critic_warmup=0"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("train_batch_size: 64"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lr: 5e-07"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("n: 16"), std::string::npos);
  EXPECT_NE(r.out.find("max_response_length: 512"), std::string::npos);  // a default
  // verl plumbing keys are accepted and reported.
  EXPECT_NE(r.err.find("trainer.critic_warmup has no effect in rpg"), std::string::npos) << r.err;
}

// verl keys rpg reads nothing from are said to have no effect (with the reason), not kept as
// settings the config shows and nothing uses.
TEST(Cli, KeysWithoutEffectAreReportedAndNotShown) {
  const std::vector<std::string> keys = {"data.val_batch_size=8", "actor_rollout_ref.model.tokenizer_path=/x",
                                         "algorithm.lam=0.95", "reward_model.overlong_buffer.log=true",
                                         "trainer.project_name=p", "trainer.experiment_name=e"};
  std::vector<std::string> args = {"config", "show", "-"};
  args.insert(args.end(), keys.begin(), keys.end());
  ProcessResult r = rpg(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const auto& kv : keys) {
    const std::string key = kv.substr(0, kv.find('='));
    EXPECT_NE(r.err.find(key + " has no effect in rpg ("), std::string::npos) << key << "\n" << r.err;
    const std::string leaf = key.substr(key.rfind('.') + 1);
    EXPECT_EQ(r.out.find(" " + leaf + ":"), std::string::npos) << leaf << " still shown";
  }
}

TEST(Cli, ConfigShowErrors) {
  test::TempDir dir;
  test::write_text(dir / "typo.yaml", "actor_rollout_ref:\n  actor:\n    clip_ratio_hgh: 0.28\n");
  expect_one_line_error(rpg({"config", "show", (dir / "typo.yaml").string()}), 1,
                        "unknown key 'actor_rollout_ref.actor.clip_ratio_hgh'; did you mean "
                        "'actor_rollout_ref.actor.clip_ratio_high'?");
  expect_one_line_error(rpg({"config", "show", "-", "data.train_batch_size=lots"}), 1,
                        "data.train_batch_size: expected an integer, got 'lots'");
  expect_one_line_error(rpg({"config", "show", "-", "actor_rollout_ref.rollout.top_p=1.5"}), 1,
                        "actor_rollout_ref.rollout.top_p: must be in (0, 1], got 1.5");
  expect_one_line_error(rpg({"config", "show", (dir / "missing.yaml").string()}), 1, "missing.yaml");
  test::write_text(dir / "bad.yaml", "data: {train_batch_size: 3\n");
  expect_one_line_error(rpg({"config", "show", (dir / "bad.yaml").string()}), 1, "malformed YAML");
  expect_one_line_error(rpg({"config", "show"}), 2, "missing argument CONFIG");
}

// Every numeric leaf of a YAML tree, as dotted keys (list elements as key[i]).
void numeric_leaves(const ConfigNode& n, const std::string& key, std::set<std::string>& out) {
  if (n.kind == ConfigNode::Kind::Map) {
    for (const auto& e : n.map) numeric_leaves(e.value, key.empty() ? e.key : key + "." + e.key, out);
  } else if (n.kind == ConfigNode::Kind::List) {
    for (size_t i = 0; i < n.list.size(); ++i) numeric_leaves(n.list[i], key + "[" + std::to_string(i) + "]", out);
  } else if (n.kind == ConfigNode::Kind::Scalar && !n.quoted && !n.scalar.empty()) {
    char* end = nullptr;
    std::strtod(n.scalar.c_str(), &end);
    if (*end == '\0') out.insert(key);
  }
}

// Every numeric key of the resolved config (optional ones set so that they print), set out of
// its range, is refused by `rpg config show` in one line that starts with the full dotted key.
// A numeric key added without a range check fails here until it gets one (or is listed as
// unbounded with a reason).
TEST(Cli, ConfigShowRejectsEveryOutOfRangeNumberNamingTheFullKey) {
  const std::string a = "actor_rollout_ref.actor.", r = "actor_rollout_ref.rollout.";
  // key -> an out-of-range value (lists: the override of the whole list, key names the element)
  const std::map<std::string, std::pair<std::string, std::string>> bad = {
      {"data.max_prompt_length", {"data.max_prompt_length", "0"}},
      {"data.max_response_length", {"data.max_response_length", "0"}},
      {"data.train_batch_size", {"data.train_batch_size", "0"}},
      {"data.gen_batch_size", {"data.gen_batch_size", "0"}},
      {"data.seed", {"data.seed", "-3"}},
      {"data.train_max_samples", {"data.train_max_samples", "0"}},
      {"data.val_max_samples", {"data.val_max_samples", "-2"}},
      {a + "ppo_mini_batch_size", {a + "ppo_mini_batch_size", "0"}},
      {a + "ppo_micro_batch_size_per_gpu", {a + "ppo_micro_batch_size_per_gpu", "0"}},
      {a + "ppo_micro_batch_size", {a + "ppo_micro_batch_size", "-1"}},
      {a + "ppo_max_token_len_per_gpu", {a + "ppo_max_token_len_per_gpu", "0"}},
      {a + "ppo_epochs", {a + "ppo_epochs", "0"}},
      {a + "clip_ratio", {a + "clip_ratio", "1"}},
      {a + "clip_ratio_low", {a + "clip_ratio_low", "1.5"}},
      {a + "clip_ratio_high", {a + "clip_ratio_high", "-0.1"}},
      {a + "clip_ratio_c", {a + "clip_ratio_c", "1"}},
      {a + "kl_loss_coef", {a + "kl_loss_coef", "-1"}},
      {a + "ref_update_freq", {a + "ref_update_freq", "0"}},
      {a + "ref_kl_target", {a + "ref_kl_target", "-0.5"}},
      {a + "ref_kl_ema", {a + "ref_kl_ema", "0"}},
      {a + "grad_clip", {a + "grad_clip", "0"}},
      {a + "optim.lr", {a + "optim.lr", "0"}},
      {a + "optim.weight_decay", {a + "optim.weight_decay", "-0.01"}},
      {a + "optim.betas[0]", {a + "optim.betas", "[1.0, 0.999]"}},
      {a + "optim.betas[1]", {a + "optim.betas", "[0.9, -0.1]"}},
      {a + "optim.lr_warmup_steps", {a + "optim.lr_warmup_steps", "-2"}},
      {a + "optim.lr_warmup_steps_ratio", {a + "optim.lr_warmup_steps_ratio", "1.5"}},
      {a + "optim.min_lr_ratio", {a + "optim.min_lr_ratio", "-0.1"}},
      {a + "optim.num_cycles", {a + "optim.num_cycles", "0"}},
      {a + "optim.total_training_steps", {a + "optim.total_training_steps", "0"}},
      {r + "n", {r + "n", "0"}},
      {r + "temperature", {r + "temperature", "-1"}},
      {r + "top_p", {r + "top_p", "0"}},
      {r + "top_k", {r + "top_k", "0"}},
      {r + "max_num_seqs", {r + "max_num_seqs", "0"}},
      {r + "max_num_batched_tokens", {r + "max_num_batched_tokens", "0"}},
      {r + "kv_cache_memory_fraction", {r + "kv_cache_memory_fraction", "1.5"}},
      {r + "val_kwargs.temperature", {r + "val_kwargs.temperature", "-0.5"}},
      {r + "val_kwargs.top_p", {r + "val_kwargs.top_p", "1.01"}},
      {r + "val_kwargs.top_k", {r + "val_kwargs.top_k", "-5"}},
      {r + "val_kwargs.n", {r + "val_kwargs.n", "0"}},
      {"algorithm.gamma", {"algorithm.gamma", "1.5"}},
      {"algorithm.kl_ctrl.kl_coef", {"algorithm.kl_ctrl.kl_coef", "-0.001"}},
      {"algorithm.kl_ctrl.horizon", {"algorithm.kl_ctrl.horizon", "0"}},
      {"algorithm.kl_ctrl.target_kl", {"algorithm.kl_ctrl.target_kl", "0"}},
      {"algorithm.rollout_correction.rollout_is_threshold", {"algorithm.rollout_correction.rollout_is_threshold", "0"}},
      {"reward_model.overlong_buffer.len", {"reward_model.overlong_buffer.len", "-1"}},
      {"reward_model.overlong_buffer.penalty_factor", {"reward_model.overlong_buffer.penalty_factor", "-1"}},
      {"reward_model.num_workers", {"reward_model.num_workers", "-1"}},
      {"reward_model.request_batch_size", {"reward_model.request_batch_size", "0"}},
      {"reward_model.timeout_s", {"reward_model.timeout_s", "0"}},
      {"trainer.total_epochs", {"trainer.total_epochs", "0"}},
      {"trainer.total_training_steps", {"trainer.total_training_steps", "0"}},
      {"trainer.test_freq", {"trainer.test_freq", "-2"}},
      {"trainer.save_freq", {"trainer.save_freq", "-2"}},
      {"trainer.max_actor_ckpt_to_keep", {"trainer.max_actor_ckpt_to_keep", "-1"}},
      {"trainer.seed", {"trainer.seed", "-1"}},
      {"trainer.max_consecutive_skips", {"trainer.max_consecutive_skips", "0"}},
      {"trainer.sample_log_freq", {"trainer.sample_log_freq", "-1"}},
      {"trainer.sample_log_count", {"trainer.sample_log_count", "-1"}},
      {"trainer.nnodes", {"trainer.nnodes", "0"}},
      {"trainer.n_gpus_per_node", {"trainer.n_gpus_per_node", "0"}},
      {"actor_rollout_ref.nccl_timeout", {"actor_rollout_ref.nccl_timeout", "0"}},
      {"dist.zero_stage", {"dist.zero_stage", "3"}},
      {"dist.reduce_bucket_mb", {"dist.reduce_bucket_mb", "0"}},
      {"actor_rollout_ref.model.lora_rank", {"actor_rollout_ref.model.lora_rank", "-1"}},
      {"actor_rollout_ref.model.lora_alpha", {"actor_rollout_ref.model.lora_alpha", "0"}},
      {"actor_rollout_ref.model.lora_dropout", {"actor_rollout_ref.model.lora_dropout", "0.1"}},
      {"actor_rollout_ref.model.lora_init_seed", {"actor_rollout_ref.model.lora_init_seed", "-1"}},
  };
  // Numeric keys every value of which means something.
  const std::set<std::string> unbounded = {
      a + "entropy_coeff",                          // negative: an entropy penalty
      "algorithm.filter_groups.max_num_gen_batches",  // <= 0: no limit
      "reward_model.timeout_score",                   // any score a timed-out response should get
  };
  // Optional numeric keys print as null by default: set them so that the walk sees them.
  ProcessResult shown = rpg({"config", "show", "-", "data.gen_batch_size=1024", "data.seed=1",
                             a + "ppo_micro_batch_size_per_gpu=2",
                             a + "clip_ratio_low=0.2", a + "clip_ratio_high=0.28", "trainer.total_training_steps=3",
                             "trainer.max_actor_ckpt_to_keep=2", "trainer.nnodes=1", "trainer.n_gpus_per_node=1",
                             "actor_rollout_ref.model.lora_init_seed=1"});
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  std::set<std::string> numeric;
  numeric_leaves(parse_yaml(shown.out, "config show"), "", numeric);
  ASSERT_GT(numeric.size(), 50u);
  for (const auto& key : numeric)
    EXPECT_TRUE(bad.count(key) || unbounded.count(key)) << key << ": a numeric key with no out-of-range case here";
  for (const auto& [key, override_] : bad) {
    // The deprecated global micro-batch resolves into ppo_micro_batch_size_per_gpu.
    EXPECT_TRUE(numeric.count(key) || key == a + "ppo_micro_batch_size") << key << ": not a numeric key of the resolved config";
    const ProcessResult e = rpg({"config", "show", "-", override_.first + "=" + override_.second});
    EXPECT_NE(e.exit_code, 0) << key << "=" << override_.second << " was accepted";
    EXPECT_EQ(count_lines(e.err), 1u) << e.err;
    EXPECT_EQ(e.err.rfind("rpg: error: " + key + ": ", 0), 0u) << key << "=" << override_.second << ": " << e.err;
  }
  // The example, with a recipe.
  expect_one_line_error(rpg({"config", "show", (test::source_dir() / "recipes" / "grpo.yaml").string(),
                             a + "kl_loss_coef=-1"}),
                        1, "rpg: error: actor_rollout_ref.actor.kl_loss_coef: must be >= 0, got -1");
}

// verl's deprecated global actor.ppo_micro_batch_size is divided over the processes, as
// verl's fsdp_workers.py does, into the per-GPU micro-batch (shown resolved, with a notice);
// setting both is refused as verl refuses it.
TEST(Cli, DeprecatedGlobalMicroBatchIsDividedOverTheProcesses) {
  const std::string a = "actor_rollout_ref.actor.";
  ProcessResult r = rpg({"config", "show", "-", a + "ppo_micro_batch_size=16", "trainer.n_gpus_per_node=8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("ppo_micro_batch_size_per_gpu: 2\n"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ppo_micro_batch_size: ~\n"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find(a + "ppo_micro_batch_size=16 (deprecated) is " + a + "ppo_micro_batch_size_per_gpu=2 over 8 processes"),
            std::string::npos)
      << r.err;
  expect_one_line_error(rpg({"config", "show", "-", a + "ppo_micro_batch_size=16", a + "ppo_micro_batch_size_per_gpu=4"}),
                        1, "rpg: error: " + a + "ppo_micro_batch_size: set together with " + a +
                               "ppo_micro_batch_size_per_gpu");
  expect_one_line_error(rpg({"config", "show", "-", a + "ppo_micro_batch_size=4", "trainer.n_gpus_per_node=8"}), 1,
                        "rpg: error: " + a + "ppo_micro_batch_size: 4 rows over trainer.nnodes x trainer.n_gpus_per_node "
                        "= 8 processes leave none per process");
}

// Every recipe of the paper's matrix loads, validates, and keeps the paper's shared settings.
TEST(Cli, EveryRecipeLoads) {
  size_t count = 0;
  for (const auto& e : std::filesystem::directory_iterator(test::source_dir() / "recipes")) {
    if (e.path().extension() != ".yaml") continue;
    ++count;
    ProcessResult r = rpg({"config", "show", e.path().string()});
    ASSERT_EQ(r.exit_code, 0) << e.path() << ": " << r.err;
    EXPECT_NE(r.out.find("lr: 1e-06"), std::string::npos) << e.path();
    EXPECT_NE(r.out.find("train_batch_size: 512"), std::string::npos) << e.path();
    EXPECT_NE(r.out.find("n: 16"), std::string::npos) << e.path();
  }
  EXPECT_EQ(count, 24u);  // 4 baselines + 4 RPG + 4 divergences x 2 clip pairs x 2 optimizers
  expect_one_line_error(rpg({"config", "show", "-", "actor_rollout_ref.actor.policy_loss=rpg_reinfroce"}), 1,
                        "actor_rollout_ref.actor.policy_loss: unknown name 'rpg_reinfroce'; valid:");
}

}  // namespace
}  // namespace rpg
