// Preemption (core/signals.h): `rpg train` and `rpg sft` on SIGTERM / SIGINT finish the
// current step, save (trainer.save_on_preempt), log one line and exit 75; a second signal
// ends the process at once. Resuming after a preemption ends bit-identical to an
// uninterrupted run. Signals land at chosen points through RPG_TEST_KILL_AT=<point>:<n>:TERM
// (core/test_hook.h), and at random moments from another process.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <thread>

#include "rpg/core/rng.h"
#include "run_fixture.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

constexpr int kSteps = 8;

class Preemption : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixture_ = new fs::path(test::oracle_output_dir("tiny_chat_model.py"));
    shared_ = new test::TempDir();
    data_ = new std::string(test::prepare_prompts(shared_->path()));
    // The uninterrupted run every interrupted one must equal. No periodic checkpoints:
    // the only ones an interrupted run has are the preemption's.
    const auto r = test::run_process(test::tiny_train_argv(*fixture_, *data_, shared_->path() / "whole", kSteps, -1));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    for (const auto& m : test::step_metrics(shared_->path() / "whole" / "metrics.jsonl"))
      ASSERT_GT(m.at("actor/grad_norm"), 0.0) << "every step must move the weights";
  }
  static void TearDownTestSuite() {
    delete shared_;
    delete fixture_;
    delete data_;
  }

  std::vector<std::string> argv(const std::vector<std::string>& extra = {}) const {
    auto a = test::tiny_train_argv(*fixture_, *data_, run_, kSteps, -1);
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  }
  test::ProcessResult train(const std::string& kill_at, const std::vector<std::string>& extra = {}) const {
    return test::run_process(argv(extra), {"RPG_TEST_KILL_AT=" + kill_at});
  }
  void expect_identical_to_whole() const {
    const fs::path whole = shared_->path() / "whole";
    const std::string last = "global_step_" + std::to_string(kSteps);
    EXPECT_EQ(read_file(whole / last / "actor" / "model.safetensors"),
              read_file(run_ / last / "actor" / "model.safetensors"));
    EXPECT_EQ(read_file(whole / last / "train_state.safetensors"), read_file(run_ / last / "train_state.safetensors"));
    const auto want = test::step_metrics(whole / "metrics.jsonl"), got = test::step_metrics(run_ / "metrics.jsonl");
    EXPECT_EQ(want.size(), static_cast<size_t>(kSteps));
    EXPECT_EQ(got, want);
    EXPECT_EQ(test::temporaries(run_), std::vector<std::string>{});
    EXPECT_FALSE(fs::exists(run_ / "rpg.lock")) << "the run-directory lock was not released";
  }
  // The one `rpg: preempted:` line of a preempted run; returns the step it names.
  int expect_preempted(const test::ProcessResult& r, const std::string& signal) const {
    EXPECT_EQ(r.exit_code, 75) << r.err;
    const auto lines = test::lines_starting(r.err, "rpg: preempted: ");
    EXPECT_EQ(lines.size(), 1u) << r.err;
    EXPECT_EQ(test::lines_starting(r.err, "rpg: error").size(), 0u) << r.err;
    if (lines.empty()) return -1;
    int step = -1, total = -1;
    const std::string want_prefix = "rpg: preempted: " + signal + " at step ";
    EXPECT_EQ(lines[0].rfind(want_prefix, 0), 0u) << lines[0];
    std::sscanf(lines[0].c_str() + want_prefix.size(), "%d/%d", &step, &total);
    EXPECT_EQ(total, kSteps) << lines[0];
    return step;
  }

  static fs::path* fixture_;
  static test::TempDir* shared_;
  static std::string* data_;
  test::TempDir dir_;
  fs::path run_ = dir_ / "run";
};
fs::path* Preemption::fixture_ = nullptr;
test::TempDir* Preemption::shared_ = nullptr;
std::string* Preemption::data_ = nullptr;

TEST_F(Preemption, SigtermThenSigintMidStepEachCheckpointThenResumeIsBitIdentical) {
  // SIGTERM during the 20th decode step: that step completes, its checkpoint is written.
  auto r = train("generation:20:TERM");
  const int first = expect_preempted(r, "SIGTERM");
  ASSERT_GE(first, 1);
  ASSERT_LT(first, kSteps);
  EXPECT_NE(r.err.find("checkpoint " + (run_ / ("global_step_" + std::to_string(first))).string() +
                       "; run the same command again to resume"),
            std::string::npos)
      << r.err;
  EXPECT_EQ(test::expect_only_complete_checkpoints(run_), first);
  EXPECT_EQ(test::step_metrics(run_ / "metrics.jsonl").size(), static_cast<size_t>(first));
  EXPECT_EQ(test::temporaries(run_), std::vector<std::string>{});

  // Resumed, then SIGINT (Ctrl-C) during its 20th decode step.
  r = train("generation:20:INT");
  EXPECT_NE(r.err.find("resumed from " + (run_ / ("global_step_" + std::to_string(first))).string()), std::string::npos)
      << r.err;
  const int second = expect_preempted(r, "SIGINT");
  ASSERT_GT(second, first);
  EXPECT_EQ(test::expect_only_complete_checkpoints(run_), second);

  // To the end.
  r = train("");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_identical_to_whole();
}

TEST_F(Preemption, SigtermWhileStartingIsHeldForTheHandlerAndStopsBeforeTheFirstStep) {
  // A scheduler's SIGTERM can come while the process is still loading libtorch: raised at the
  // top of rpg-torch's main (RPG_TEST_KILL_AT=startup), it must wait, blocked, for train's
  // handler and stop the run at its first step boundary (exit 75), not kill it (exit 143,
  // as soak.sh saw 7 times in 38 starts signalled 3-15 s after launch on a loaded machine).
  auto r = train("startup:1:TERM");
  EXPECT_EQ(expect_preempted(r, "SIGTERM"), 0);
  EXPECT_NE(r.err.find("nothing to save before the first step"), std::string::npos) << r.err;
  EXPECT_FALSE(fs::exists(run_ / "rpg.lock")) << "the run-directory lock was not released";
  r = train("");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_identical_to_whole();

  // A command without stop handling still ends on the signal, at once.
  r = test::run_process({test::rpg_binary().string(), "version"}, {"RPG_TEST_KILL_AT=startup:1:TERM"});
  EXPECT_EQ(r.exit_code, -SIGTERM) << r.err;
}

TEST_F(Preemption, SecondSignalDuringThePreemptionCheckpointExitsAtOnceAndNothingPartialIsLoaded) {
  // The first SIGTERM mid-step; the second while the preemption checkpoint is half written.
  auto r = train("generation:20:TERM,checkpoint_write:1:TERM");
  EXPECT_EQ(r.exit_code, -SIGTERM) << r.err;
  EXPECT_NE(r.err.find("rpg: second signal: exiting at once"), std::string::npos) << r.err;
  EXPECT_EQ(test::lines_starting(r.err, "rpg: preempted").size(), 0u) << r.err;
  EXPECT_EQ(test::expect_only_complete_checkpoints(run_), 0) << "a half-written checkpoint was published";
  r = train("");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err.find("resumed from"), std::string::npos) << r.err;
  expect_identical_to_whole();
}

TEST_F(Preemption, WithoutSaveOnPreemptNoCheckpointIsWritten) {
  auto r = train("generation:20:TERM", {"trainer.save_on_preempt=false"});
  const int step = expect_preempted(r, "SIGTERM");
  EXPECT_GE(step, 1);
  EXPECT_NE(r.err.find("no checkpoint written (trainer.save_on_preempt=false)"), std::string::npos) << r.err;
  EXPECT_EQ(test::loadable_checkpoints(run_).size(), 0u);
  // metrics.jsonl holds the finished steps; a restart starts over and drops them.
  EXPECT_EQ(test::step_metrics(run_ / "metrics.jsonl").size(), static_cast<size_t>(step));
  r = train("", {"trainer.save_on_preempt=false"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_identical_to_whole();
}

// Step records in a metrics.jsonl (0 when absent): the lines with timing_s/step, not a
// checkpoint's timing record.
int count_steps(const fs::path& file) {
  if (!fs::exists(file)) return 0;
  std::istringstream in(read_file(file));
  int n = 0;
  for (std::string line; std::getline(in, line);) n += line.find("\"timing_s/step\"") != std::string::npos;
  return n;
}

// Starts `argv` (environment inherited); once `metrics` holds more than `after_steps`
// steps, waits `delay_ms` more and sends SIGTERM (if still running); waits. Exit status,
// or -signal. Anchored on progress, not on a timing estimate: the moment within the step
// is random, the step is chosen.
int run_and_term(const std::vector<std::string>& argv, const fs::path& metrics, int after_steps, int delay_ms) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::vector<char*> a;
    std::vector<std::string> copy = argv;
    for (auto& s : copy) a.push_back(s.data());
    a.push_back(nullptr);
    if (!freopen("/dev/null", "w", stdout) || !freopen("/dev/null", "w", stderr)) _exit(126);
    execv(a[0], a.data());
    _exit(127);
  }
  int status = 0;
  bool sent = false;
  std::optional<std::chrono::steady_clock::time_point> deadline;
  while (true) {
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    if (!deadline && count_steps(metrics) > after_steps)
      deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(delay_ms);
    if (!sent && deadline && std::chrono::steady_clock::now() >= *deadline) {
      kill(pid, SIGTERM);
      sent = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
}

TEST_F(Preemption, SigtermFromOutsideAtRandomMomentsThenResumeIsBitIdentical) {
  // The uninterrupted run's mean time per step (timing_s/step) bounds the random delay
  // within a step.
  double step_s = 0;
  {
    std::istringstream in(read_file(shared_->path() / "whole" / "metrics.jsonl"));
    std::string line;
    while (std::getline(in, line)) step_s += nlohmann::json::parse(line).value("timing_s/step", 0.0) / kSteps;
  }
  const int step_ms = std::max(1, static_cast<int>(step_s * 1000));
  RandomStream rs(19);
  int preempted = 0, attempts = 0;
  while (attempts++ < 3 * kSteps) {
    // SIGTERM at a random moment of the step after the next one finishes (or later).
    const int done = test::loadable_checkpoints(run_).empty() ? 0 : test::loadable_checkpoints(run_).front().first;
    const int delay = static_cast<int>(rs.next_u64() % static_cast<uint64_t>(step_ms + 1));
    const int code = run_and_term(argv(), run_ / "metrics.jsonl", done, delay);
    if (code == 0) break;
    ASSERT_EQ(code, 75) << "attempt " << attempts << ": exit " << code;
    ++preempted;
    EXPECT_GT(test::expect_only_complete_checkpoints(run_), done) << "a preemption saved no new step";
    EXPECT_EQ(test::temporaries(run_), std::vector<std::string>{});
  }
  ASSERT_LT(attempts, 3 * kSteps) << "never finished";
  // Each SIGTERM comes within about one step of a finished step: at least the first run
  // of the 8 steps is preempted (usually three are).
  EXPECT_GE(preempted, 1) << "the test did not preempt the run";
  expect_identical_to_whole();
  std::cerr << "preempted " << preempted << " times in " << attempts << " runs\n";
}

TEST(SftPreemption, SigtermSavesTheModelSoFarAndExits75) {
  const auto fixture = test::oracle_output_dir("tiny_chat_model.py");
  test::TempDir dir;
  std::string pairs;
  for (int i = 0; i < 6; ++i)
    pairs += "{\"prompt\": \"" + std::to_string(i) + "+1?\", \"response\": \"" + std::to_string(i + 1) + "\"}\n";
  test::write_text(dir / "pairs.jsonl", pairs);
  auto sft = [&](const std::string& out, const std::string& steps, const std::string& kill_at) {
    return test::run_process({test::rpg_binary().string(), "sft", "--model", (fixture / "model").string(), "--data",
                              (dir / "pairs.jsonl").string(), "--output", (dir / out).string(), "--steps", steps,
                              "--batch-size", "2", "--lr", "1e-3", "--lr-scheduler", "constant", "--warmup-ratio", "0",
                              "--device", "cpu", "--no-progress"},
                             {"RPG_TEST_KILL_AT=" + kill_at});
  };
  // SIGTERM inside the 3rd optimizer step: it completes, then the loop stops.
  auto r = sft("stopped", "10", "optimizer_step:3:TERM");
  EXPECT_EQ(r.exit_code, 75) << r.err;
  const auto lines = test::lines_starting(r.err, "rpg: preempted: ");
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(lines[0], "rpg: preempted: SIGTERM at step 3/10: the model so far saved to " +
                          (dir / "stopped" / "model").string() + " (sft does not resume: rerun to train all steps)");
  // The saved model is the 3-step model (constant LR: a 3-step run takes the same steps).
  r = sft("three", "3", "");
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(read_file(dir / "stopped" / "model" / "model.safetensors"),
            read_file(dir / "three" / "model" / "model.safetensors"));
  EXPECT_EQ(test::step_metrics(dir / "stopped" / "metrics.jsonl").size(), 3u);
}

}  // namespace
}  // namespace rpg
