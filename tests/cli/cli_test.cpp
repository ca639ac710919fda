// `rpg` run as a subprocess: exit codes, one-line errors, help and config output.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>

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

TEST(Cli, UnknownFlagIsUsageError) {
  expect_one_line_error(rpg({"config", "show", "--bogus"}), 2, "unknown option '--bogus'");
}

TEST(Cli, ConfigShowPrintsDefaultsAndOverrides) {
  test::TempDir dir;
  test::write_text(dir / "run.yaml",
                   "data:\n  train_batch_size: 64\nactor_rollout_ref:\n  actor:\n    ppo_mini_batch_size: 32\n");
  ProcessResult r = rpg({"config", "show", (dir / "run.yaml").string(), "actor_rollout_ref.actor.optim.lr=5e-7",
                         "actor_rollout_ref.rollout.n=16", "trainer.n_gpus_per_node=8"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("train_batch_size: 64"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("lr: 5e-07"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("n: 16"), std::string::npos);
  EXPECT_NE(r.out.find("max_response_length: 512"), std::string::npos);  // a default
  // verl plumbing keys are accepted and reported.
  EXPECT_NE(r.err.find("trainer.n_gpus_per_node has no effect in rpg"), std::string::npos) << r.err;
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
