// `rpg train` killed with SIGKILL and restarted until it finishes ends with bit-identical
// weights, training state and per-step metrics to an uninterrupted run. Two ways to kill:
// at random moments (timed), and at three guaranteed points through the test hook
// RPG_TEST_KILL_AT (core/test_hook.h): inside checkpoint writing (the training-state file
// half on disk), during generation, and in the middle of an optimizer step. After every
// kill, no checkpoint directory the loader would pick is incomplete.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "rpg/core/io.h"
#include "rpg/core/rng.h"
#include "run_fixture.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

// Shared with the other run tests (run_fixture.h).
using test::complete_safetensors;
using test::loadable_checkpoints;
using test::prepare_prompts;
using test::step_metrics;

// Starts rpg with `args`; kills it with SIGKILL after `kill_after_ms` (if still running).
// Returns the exit status (or -9 when killed).
int run_and_maybe_kill(const std::vector<std::string>& args, int kill_after_ms) {
  pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> argv;
    std::string bin = test::rpg_binary().string();
    argv.push_back(bin.data());
    std::vector<std::string> copy = args;
    for (auto& a : copy) argv.push_back(a.data());
    argv.push_back(nullptr);
    setenv("OMP_NUM_THREADS", "1", 1);
    freopen("/dev/null", "w", stdout);
    freopen("/dev/null", "w", stderr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(kill_after_ms);
  int status = 0;
  while (true) {
    pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -9;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

// No directory the loader would pick is incomplete, and the latest marker names one of them.
// Returns the newest checkpoint's step. `actor_file`: the weights file of actor/.
int expect_only_complete_checkpoints(const fs::path& run, const std::string& actor_file) {
  const auto dirs = loadable_checkpoints(run);
  for (const auto& [n, dir] : dirs) {
    EXPECT_TRUE(fs::exists(dir / "train_state.json")) << dir;
    EXPECT_TRUE(complete_safetensors(dir / "train_state.safetensors")) << dir;
    EXPECT_TRUE(complete_safetensors(dir / "actor" / actor_file)) << dir;
  }
  if (dirs.empty()) return 0;
  // The marker is rewritten right after a checkpoint directory is published (as verl's is): a
  // SIGKILL between the two leaves it naming the checkpoint before (seen once in CI: marker 4,
  // newest 5); the resume then starts there and redoes the step, which the caller checks ends
  // bit-identical. It never names a missing, incomplete or older checkpoint.
  const int marked = std::stoi(read_file(run / "latest_checkpointed_iteration.txt"));
  const bool newest = marked == dirs.front().first, one_before = dirs.size() > 1 && marked == dirs[1].first;
  EXPECT_TRUE(newest || one_before) << "the latest marker names step " << marked << ", the newest checkpoint is step "
                                    << dirs.front().first;
  return dirs.front().first;
}

class ResumeAfterKill : public ::testing::Test {
 protected:
  void SetUp() override {
    fixture_ = test::oracle_output_dir("tiny_chat_model.py");
    data_ = prepare_prompts(dir_.path());
    whole_ = dir_ / "whole";
    killed_ = dir_ / "killed";
    const auto t0 = std::chrono::steady_clock::now();
    ASSERT_EQ(run_and_maybe_kill(args_for(whole_), 600000), 0);
    whole_ms_ = static_cast<int>(
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());
    // Every step must move the weights, or equal weights would prove little: the tiny
    // model never answers right (all scores -1, zero advantages), so the entropy bonus and
    // the KL loss supply the gradient.
    for (const auto& m : step_metrics(whole_ / "metrics.jsonl")) ASSERT_GT(m.at("actor/grad_norm"), 0.0);
  }

  // 24 steps over 8 prompts (6 epochs: reshuffles and epoch boundaries), a checkpoint every
  // step, two optimizer steps per training step (two mini-batches).
  std::vector<std::string> args_for(const fs::path& run) const {
    std::vector<std::string> a = {"train", "-", "actor_rollout_ref.model.path=" + (fixture_ / "model").string(), "data.train_files=" + data_,
            "data.train_batch_size=2", "data.max_prompt_length=256", "data.max_response_length=8",
            "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
            "actor_rollout_ref.actor.policy_loss=rpg_reinforce", "actor_rollout_ref.actor.optim.lr=1e-2",
            "actor_rollout_ref.actor.entropy_coeff=0.01", "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.kl_loss_coef=0.1", "algorithm.adv_estimator=rpg_batch",
            "trainer.total_training_steps=24", "trainer.save_freq=1", "trainer.max_actor_ckpt_to_keep=2",
            "trainer.device=cpu", "trainer.default_local_dir=" + run.string()};
    a.insert(a.end(), extra_.begin(), extra_.end());
    return a;
  }
  int expect_only_complete_checkpoints(const fs::path& run) const {
    return rpg::expect_only_complete_checkpoints(run, actor_file_);
  }

  // Runs rpg train on the killed run dir with RPG_TEST_KILL_AT=`kill_at` ("" = none).
  test::ProcessResult run_killed(const std::string& kill_at) const {
    std::vector<std::string> argv = {test::rpg_binary().string()};
    for (const auto& a : args_for(killed_)) argv.push_back(a);
    // One thread, as run_and_maybe_kill's: the rollout's own log-probs (training/rollout_*
    // metrics) depend on the thread count's GEMM blocking.
    return test::run_process(argv, {"RPG_TEST_KILL_AT=" + kill_at, "OMP_NUM_THREADS=1"});
  }

  // Kills inside a checkpoint's writing, during generation and inside an optimizer step
  // (RPG_TEST_KILL_AT), then runs to the end: bit-identical to the uninterrupted run.
  void kill_at_three_points_then_finish();

  // The killed-and-resumed run ended exactly as the uninterrupted one.
  void expect_identical_to_whole() const {
    EXPECT_EQ(read_file(whole_ / "global_step_24" / "actor" / actor_file_),
              read_file(killed_ / "global_step_24" / "actor" / actor_file_));
    EXPECT_EQ(read_file(whole_ / "global_step_24" / "train_state.safetensors"),
              read_file(killed_ / "global_step_24" / "train_state.safetensors"));
    const auto want = step_metrics(whole_ / "metrics.jsonl"), got = step_metrics(killed_ / "metrics.jsonl");
    EXPECT_EQ(want.size(), 24u);
    ASSERT_EQ(got.size(), want.size());
    for (size_t s = 0; s < want.size(); ++s) {  // key by key, so that a failure names what differs
      EXPECT_EQ(got[s].size(), want[s].size()) << "step " << s + 1;
      for (const auto& [k, v] : want[s]) {
        auto it = got[s].find(k);
        if (it == got[s].end()) ADD_FAILURE() << "step " << s + 1 << ": " << k << " missing";
        else EXPECT_EQ(it->second, v) << "step " << s + 1 << ": " << k;
      }
    }
    for (const auto& e : fs::directory_iterator(killed_))
      EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "left over: " << e.path();
  }

  // Overrides after the run's own (a subclass's mode), and the weights file they make actor/ hold.
  std::vector<std::string> extra_;
  std::string actor_file_ = "model.safetensors";
  test::TempDir dir_;
  fs::path fixture_, whole_, killed_;
  std::string data_;
  int whole_ms_ = 0;
};

TEST_F(ResumeAfterKill, SigkillAtRandomMomentsThenResumeIsBitIdentical) {
  RandomStream rs(77);
  int kills = 0, attempts = 0;
  while (attempts++ < 60) {
    // Kill after 15-50% of an uninterrupted run's time: during start-up, generation,
    // updates or checkpoint writing (every step writes one).
    const int delay =
        whole_ms_ * 15 / 100 + static_cast<int>(rs.next_u64() % static_cast<uint64_t>(whole_ms_ * 35 / 100 + 1));
    int code = run_and_maybe_kill(args_for(killed_), delay);
    if (code == 0) break;
    ASSERT_EQ(code, -9) << "rpg train failed on attempt " << attempts;
    ++kills;
    if (fs::exists(killed_)) expect_only_complete_checkpoints(killed_);
  }
  ASSERT_LT(attempts, 60) << "never finished";
  EXPECT_GE(kills, 2) << "the test did not interrupt the run enough";
  expect_identical_to_whole();
  std::cerr << "killed " << kills << " times\n";
}

// LoRA adapters (KL in the reward to an iterative reference refreshed every 5 steps: the
// adapter snapshot is part of what resumes), the same kills.
class LoraResumeAfterKill : public ResumeAfterKill {
 protected:
  LoraResumeAfterKill() {
    extra_ = {"actor_rollout_ref.model.lora_rank=4", "actor_rollout_ref.model.lora_alpha=8",
              "algorithm.use_kl_in_reward=true", "algorithm.kl_ctrl.kl_coef=0.1",
              "actor_rollout_ref.actor.use_iterative_ref_model=true", "actor_rollout_ref.actor.ref_update_freq=5"};
    actor_file_ = "adapter_model.safetensors";
  }
};

TEST_F(ResumeAfterKill, SigkillInsideCheckpointWritingGenerationAndOptimizerStepThenResumeIsBitIdentical) {
  kill_at_three_points_then_finish();
}

TEST_F(LoraResumeAfterKill, SigkillInsideCheckpointWritingGenerationAndOptimizerStepThenResumeIsBitIdentical) {
  kill_at_three_points_then_finish();
}

void ResumeAfterKill::kill_at_three_points_then_finish() {
  // 1. Inside the third checkpoint's writing: actor/ written, train_state.safetensors half
  //    written, nothing published.
  auto r = run_killed("checkpoint_write:3");
  ASSERT_EQ(r.exit_code, -SIGKILL) << r.err;
  std::vector<fs::path> partial;
  for (const auto& e : fs::directory_iterator(killed_))
    if (e.path().filename().string().rfind("global_step_3.tmp.", 0) == 0) partial.push_back(e.path());
  ASSERT_EQ(partial.size(), 1u) << "the kill did not land inside the writing of global_step_3";
  EXPECT_TRUE(complete_safetensors(partial[0] / "actor" / actor_file_));
  EXPECT_TRUE(fs::exists(partial[0] / "train_state.safetensors"));
  EXPECT_FALSE(complete_safetensors(partial[0] / "train_state.safetensors")) << "expected a half-written file";
  EXPECT_FALSE(fs::exists(partial[0] / "train_state.json"));
  EXPECT_EQ(expect_only_complete_checkpoints(killed_), 2);

  // 2. During generation (the 20th decode step of the resumed process: a few steps later).
  r = run_killed("generation:20");
  ASSERT_EQ(r.exit_code, -SIGKILL) << r.err;
  EXPECT_NE(r.err.find("resumed from " + (killed_ / "global_step_2").string() + " at step 2"), std::string::npos)
      << r.err;
  EXPECT_EQ(r.err.find("skipping damaged"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(partial[0])) << "the killed run's temporary checkpoint was not removed";
  const int after_generation = expect_only_complete_checkpoints(killed_);
  EXPECT_GT(after_generation, 2) << "no step completed before the generation kill";

  // 3. In the middle of the third optimizer step of the resumed process (the second
  //    training step's first mini-batch), half of the parameters updated.
  r = run_killed("optimizer_step:3");
  ASSERT_EQ(r.exit_code, -SIGKILL) << r.err;
  EXPECT_NE(r.err.find(" at step " + std::to_string(after_generation)), std::string::npos) << r.err;
  EXPECT_EQ(expect_only_complete_checkpoints(killed_), after_generation + 1);

  // 4. To the end, uninterrupted.
  r = run_killed("");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_identical_to_whole();
}

// Resuming with changed settings: compatible ones are logged one line per key, one that
// breaks resume (a batch size) is refused with a one-line error.
TEST(ResumeConfig, CompatibleChangesAreReportedIncompatibleOnesRefused) {
  const auto fixture = test::oracle_output_dir("tiny_chat_model.py");
  test::TempDir dir;
  const std::string data = prepare_prompts(dir.path());
  auto train = [&](const std::vector<std::string>& extra) {
    std::vector<std::string> argv = {test::rpg_binary().string(), "train", "-",
                                     "actor_rollout_ref.model.path=" + (fixture / "model").string(),
                                     "data.train_files=" + data, "data.train_batch_size=2",
                                     "data.max_response_length=4", "actor_rollout_ref.rollout.n=2",
                                     "actor_rollout_ref.actor.ppo_mini_batch_size=1", "trainer.save_freq=1",
                                     "trainer.device=cpu", "trainer.default_local_dir=" + (dir / "run").string()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    return test::run_process(argv);
  };
  auto r = train({"trainer.total_training_steps=2", "actor_rollout_ref.actor.optim.lr=1e-2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("config changed"), std::string::npos) << r.err;

  r = train({"trainer.total_training_steps=3", "actor_rollout_ref.actor.optim.lr=2e-2", "trainer.test_freq=5"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("at step 2"), std::string::npos) << r.err;
  for (const std::string line : {"resume: config changed: actor_rollout_ref.actor.optim.lr 0.01 -> 0.02\n",
                                 "resume: config changed: trainer.test_freq -1 -> 5\n",
                                 "resume: config changed: trainer.total_training_steps 2 -> 3\n"})
    EXPECT_NE(r.err.find(line), std::string::npos) << "missing '" << line << "' in:\n" << r.err;
  size_t lines = 0;
  for (size_t at = r.err.find("config changed"); at != std::string::npos; at = r.err.find("config changed", at + 1))
    ++lines;
  EXPECT_EQ(lines, 3u) << r.err;

  r = train({"trainer.total_training_steps=4", "actor_rollout_ref.actor.optim.lr=2e-2", "trainer.test_freq=5",
             "data.train_batch_size=4"});
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("rpg: error: cannot resume from "), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("train_batch_size was 2"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace rpg
