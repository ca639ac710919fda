// Config changes between a checkpoint and the run resuming from it: found per dotted key,
// reported one line each, resume-location keys left out, a missing or damaged saved config
// never stops a resume.
#include "rpg/train/resume_check.h"

#include <gtest/gtest.h>

#include "rpg/core/config.h"
#include "rpg/core/io.h"
#include "test_util.h"

namespace rpg::train {
namespace {

TEST(ResumeCheck, ChangedAddedRemovedAndListValuesPerDottedKey) {
  const std::string before =
      "a:\n  b: 1\n  c: x\n  list: [1, 2]\n  gone: 3\nd:\n  e: null\n  s: \"1\"\nsame: 5\n";
  const std::string after =
      "a:\n  b: 2\n  c: x\n  list: [1, 3]\n  new: true\nd:\n  e: 0.5\n  s: 1\nsame: 5\n";
  const std::vector<ConfigChange> want = {
      {"a.b", "1", "2"},         {"a.gone", "3", "(absent)"}, {"a.list", "[1, 2]", "[1, 3]"},
      {"a.new", "(absent)", "true"}, {"d.e", "null", "0.5"},   {"d.s", "\"1\"", "1"}};
  EXPECT_EQ(config_changes(before, after), want);
  EXPECT_TRUE(config_changes(before, before).empty());
  EXPECT_EQ(format_change(want[0]), "resume: config changed: a.b 1 -> 2");
  EXPECT_THROW(config_changes("a: [1", after), ConfigError);
}

TEST(ResumeCheck, TrainConfigChangesAreTheEditedKeysOnly) {
  TrainConfig a, b;
  b.actor_rollout_ref.actor.optim.lr = 2e-5;
  b.trainer.total_training_steps = 30;
  b.trainer.test_freq = 7;
  const auto changes = config_changes(config_to_yaml(a), config_to_yaml(b));
  ASSERT_EQ(changes.size(), 3u);
  EXPECT_EQ(changes[0].key, "actor_rollout_ref.actor.optim.lr");
  EXPECT_EQ(changes[0].after, "2e-05");
  EXPECT_EQ(changes[1].key, "trainer.test_freq");
  EXPECT_EQ(changes[1].before, "-1");
  EXPECT_EQ(changes[1].after, "7");
  EXPECT_EQ(changes[2].key, "trainer.total_training_steps");
  EXPECT_EQ(changes[2].before, "null");
  EXPECT_EQ(changes[2].after, "30");
}

TEST(ResumeCheck, ReportLogsOneLinePerChangeAndLeavesOutWhereToResumeFrom) {
  test::TempDir dir;
  TrainConfig saved, now;
  save_checkpoint_config(dir.path(), saved);
  ASSERT_TRUE(std::filesystem::exists(dir / "config.yaml"));
  now.trainer.test_freq = 5;
  now.trainer.resume_mode = "resume_path";
  now.trainer.resume_path = dir.path().string();
  testing::internal::CaptureStderr();
  const auto changes = report_config_changes(dir.path(), now);
  const std::string log = testing::internal::GetCapturedStderr();
  ASSERT_EQ(changes.size(), 1u);
  EXPECT_EQ(changes[0].key, "trainer.test_freq");
  EXPECT_NE(log.find("resume: config changed: trainer.test_freq -1 -> 5\n"), std::string::npos) << log;
  EXPECT_EQ(log.find("resume_mode"), std::string::npos) << log;
  EXPECT_EQ(log.find("config changed"), log.rfind("config changed")) << "one line per change: " << log;

  testing::internal::CaptureStderr();
  EXPECT_TRUE(report_config_changes(dir.path(), saved).empty());
  EXPECT_EQ(testing::internal::GetCapturedStderr().find("config changed"), std::string::npos);
}

TEST(ResumeCheck, MissingOrDamagedSavedConfigIsReportedNotFatal) {
  test::TempDir dir;
  TrainConfig now;
  testing::internal::CaptureStderr();
  EXPECT_TRUE(report_config_changes(dir.path(), now).empty());
  EXPECT_NE(testing::internal::GetCapturedStderr().find("has no config.yaml"), std::string::npos);
  test::write_text(dir / "config.yaml", "trainer: [unterminated\n");
  testing::internal::CaptureStderr();
  EXPECT_TRUE(report_config_changes(dir.path(), now).empty());
  EXPECT_NE(testing::internal::GetCapturedStderr().find("cannot compare"), std::string::npos);
}

}  // namespace
}  // namespace rpg::train
