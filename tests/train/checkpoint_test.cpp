// RunDir: the run directory's layout, pruning and resume order, without a model.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/train/checkpoint.h"
#include "test_util.h"

namespace rpg::train {
namespace {

namespace fs = std::filesystem;

TEST(RunDir, StepOfAcceptsOnlyPublishedNames) {
  EXPECT_EQ(RunDir::step_of("global_step_12"), 12);
  EXPECT_EQ(RunDir::step_of("global_step_0"), 0);
  EXPECT_FALSE(RunDir::step_of("global_step_"));
  EXPECT_FALSE(RunDir::step_of("global_step_3.tmp.1.2"));
  EXPECT_FALSE(RunDir::step_of("global_step_3.tmp.pruned"));
  EXPECT_FALSE(RunDir::step_of("global_step_-1"));
  EXPECT_FALSE(RunDir::step_of("step_3"));
  EXPECT_EQ(RunDir("/r").checkpoint(7), fs::path("/r/global_step_7"));
}

TEST(RunDir, PruneKeepsTheNewestAndResumeTriesTheMarkerFirst) {
  test::TempDir dir;
  RunDir run(dir.path());
  for (int s : {1, 2, 10, 3}) test::write_text(run.checkpoint(s) / "train_state.json", "{}");
  fs::create_directories(dir.path() / "global_step_4.tmp.9.9");
  run.mark_latest(3);
  const auto cands = run.resume_candidates();
  ASSERT_EQ(cands.size(), 4u);
  EXPECT_EQ(cands[0], run.checkpoint(3));
  EXPECT_EQ(cands[1], run.checkpoint(10));
  EXPECT_EQ(cands[3], run.checkpoint(1));
  run.prune(2);
  ASSERT_EQ(run.checkpoints().size(), 2u);
  EXPECT_EQ(run.checkpoints()[0].first, 10);
  EXPECT_EQ(run.checkpoints()[1].first, 3);
  EXPECT_TRUE(run.has_complete(3));
  EXPECT_FALSE(run.has_complete(2));
  run.remove_partial();
  EXPECT_FALSE(fs::exists(dir.path() / "global_step_4.tmp.9.9"));
  run.prune(std::nullopt);
  EXPECT_EQ(run.checkpoints().size(), 2u);
}

TEST(RunDir, RemovePartialTakesTheTempFilesOfWritersThatAreGone) {
  // A SIGKILL between write_file_atomic's write and its rename leaves <name>.tmp.<pid>.<n>
  // (seen: report.html.tmp.* after ResumeAfterKill's random kills).
  test::TempDir dir;
  RunDir run(dir.path());
  const pid_t gone = 999999999;  // above any pid_max
  const fs::path dead = dir.path() / ("report.html.tmp." + std::to_string(gone) + ".42");
  const fs::path alive = dir.path() / ("report.html.tmp." + std::to_string(::getppid()) + ".7");
  const fs::path mine = dir.path() / ("metrics.jsonl.tmp." + std::to_string(::getpid()) + ".1");
  for (const auto& p : {dead, alive, mine}) test::write_text(p, "partial");
  test::write_text(dir.path() / "notes.tmp.txt", "a user's file");
  run.remove_partial();
  EXPECT_FALSE(fs::exists(dead));
  EXPECT_TRUE(fs::exists(alive)) << "its writer may still rename it";
  EXPECT_TRUE(fs::exists(mine));
  EXPECT_TRUE(fs::exists(dir.path() / "notes.tmp.txt"));
}

TEST(RunDir, TrainStateFormatVersion) {
  test::TempDir dir;
  write_train_state(dir.path(), {{"step", 3}});
  EXPECT_EQ(read_train_state(dir.path()).at("format_version"), RunDir::kFormatVersion);
  test::write_text(dir.path() / "train_state.json", R"({"step": 3})");
  EXPECT_EQ(read_train_state(dir.path()).at("step"), 3);  // written before format_version: version 1
  test::write_text(dir.path() / "train_state.json", R"({"step": 3, "format_version": 2})");
  EXPECT_THROW(read_train_state(dir.path()), ConfigError);
  test::write_text(dir.path() / "train_state.json", R"({"step": 3, "format_version": "x"})");
  EXPECT_THROW(read_train_state(dir.path()), FormatError);
  test::write_text(dir.path() / "train_state.json", "{");
  EXPECT_THROW(read_train_state(dir.path()), FormatError);
}

}  // namespace
}  // namespace rpg::train
