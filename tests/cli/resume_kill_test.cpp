// `rpg train` killed with SIGKILL at arbitrary moments (generation, update, checkpoint
// writing) and restarted until it finishes ends with bit-identical weights and the same
// per-step metrics as an uninterrupted run.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "rpg/core/io.h"
#include "rpg/core/rng.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

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

std::vector<double> scores(const fs::path& metrics) {
  std::vector<double> out;
  std::istringstream in(read_file(metrics));
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("critic/score/mean")) out.push_back(j["critic/score/mean"].get<double>());
  }
  return out;
}

TEST(ResumeAfterKill, SigkillAtRandomMomentsThenResumeIsBitIdentical) {
  const auto fixture = test::oracle_output_dir("tiny_chat_model.py");
  test::TempDir dir;
  std::string jsonl;
  for (int i = 0; i < 8; ++i) jsonl += "{\"problem\": \"" + std::to_string(i) + "+1?\", \"answer\": \"" + std::to_string(i + 1) + "\"}\n";
  test::write_text(dir / "p.jsonl", jsonl);
  const std::string data = (dir / "p.parquet").string();
  ASSERT_EQ(test::run_process({test::rpg_binary().string(), "data", "prepare", (dir / "p.jsonl").string(), data,
                               "--data-source", "math_dapo"})
                .exit_code,
            0);
  auto args_for = [&](const std::string& run) {
    return std::vector<std::string>{
        "train", "-", "actor_rollout_ref.model.path=" + (fixture / "model").string(), "data.train_files=" + data,
        "data.train_batch_size=2", "data.max_prompt_length=256", "data.max_response_length=8",
        "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=1",
        "actor_rollout_ref.actor.policy_loss=rpg_reinforce", "actor_rollout_ref.actor.optim.lr=1e-2",
        "algorithm.adv_estimator=rpg_batch", "trainer.total_training_steps=24", "trainer.save_freq=1",
        "trainer.max_actor_ckpt_to_keep=2", "trainer.device=cpu", "trainer.default_local_dir=" + run};
  };
  const std::string whole = (dir / "whole").string(), killed = (dir / "killed").string();
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(run_and_maybe_kill(args_for(whole), 600000), 0);
  const int whole_ms = static_cast<int>(
      std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - t0).count());

  RandomStream rs(77);
  int kills = 0, attempts = 0;
  while (attempts++ < 60) {
    // Kill after 15-50% of an uninterrupted run's time: during start-up, generation,
    // updates or checkpoint writing (every step writes one).
    const int delay = whole_ms * 15 / 100 + static_cast<int>(rs.next_u64() % static_cast<uint64_t>(whole_ms * 35 / 100 + 1));
    int code = run_and_maybe_kill(args_for(killed), delay);
    if (code == 0) break;
    ASSERT_EQ(code, -9) << "rpg train failed on attempt " << attempts;
    ++kills;
  }
  ASSERT_LT(attempts, 60) << "never finished";
  EXPECT_GE(kills, 2) << "the test did not interrupt the run enough";
  // Same final weights, byte for byte, and the same metrics for every step.
  EXPECT_EQ(read_file(fs::path(whole) / "global_step_24" / "actor" / "model.safetensors"),
            read_file(fs::path(killed) / "global_step_24" / "actor" / "model.safetensors"));
  EXPECT_EQ(read_file(fs::path(whole) / "global_step_24" / "train_state.safetensors"),
            read_file(fs::path(killed) / "global_step_24" / "train_state.safetensors"));
  EXPECT_EQ(scores(fs::path(whole) / "metrics.jsonl"), scores(fs::path(killed) / "metrics.jsonl"));
  EXPECT_EQ(scores(fs::path(killed) / "metrics.jsonl").size(), 24u);
  for (const auto& e : fs::directory_iterator(killed))
    EXPECT_EQ(e.path().filename().string().find(".tmp."), std::string::npos) << "left over: " << e.path();
  std::cerr << "killed " << kills << " times\n";
}

}  // namespace
}  // namespace rpg
