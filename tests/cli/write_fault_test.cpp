// Failing writes: every write call of `rpg train`, `rpg data prepare` and `rpg model init`
// is made to fail in turn (RPG_TEST_FAIL_WRITE=<n>, core/test_hook.h), alternately with
// ENOSPC and EIO. Each time: one `rpg: error:` line naming the file and the errno, exit 1,
// no temporary file or directory left, every loadable checkpoint complete; a rerun picks
// the checkpoint the latest marker names (complete) and ends bit-identical to an uninterrupted run, with a
// metrics.jsonl and samples.jsonl without torn lines. Once more on a real full filesystem (a small tmpfs,
// mounted in a user + mount namespace: no root needed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <regex>

#include "rpg/core/jsonl.h"
#include "run_fixture.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

constexpr int kSteps = 3;

// Temporary names (".tmp.<pid>.<random>") and TensorBoard event files (named by time, host
// and pid) differ between runs: replaced by fixed names.
std::string normalised(const std::string& s) {
  static const std::regex tmp(R"(\.tmp\.[0-9]+\.[0-9]+)"), events(R"(events\.out\.tfevents\.[^/:]*)");
  return std::regex_replace(std::regex_replace(s, tmp, ".tmp.X"), events, "events.out.tfevents.X");
}

// The write calls a run makes, in order: the file each one wrote (temporary names
// normalised to ".tmp.X").
std::vector<std::string> count_writes(const std::vector<std::string>& argv, const fs::path& list) {
  auto r = test::run_process(argv, {"RPG_TEST_COUNT_WRITES=" + list.string()});
  if (r.exit_code != 0) throw std::runtime_error("counting run failed: " + r.err);
  std::vector<std::string> out;
  std::istringstream in(read_file(list));
  std::string line;
  while (std::getline(in, line)) out.push_back(normalised(line));
  return out;
}

const char* errno_of(int n) { return n % 2 ? "ENOSPC" : "EIO"; }
std::string errno_message(int n) {
  return n % 2 ? "No space left on device (ENOSPC)" : "Input/output error (EIO)";
}

// The one error line of a run whose n-th write failed.
void expect_write_error(const test::ProcessResult& r, int n, const std::string& file) {
  EXPECT_EQ(r.exit_code, 1) << "write " << n << " (" << file << "):\n" << r.err;
  const auto lines = test::lines_starting(r.err, "rpg: error: ");
  ASSERT_EQ(lines.size(), 1u) << r.err;
  EXPECT_EQ(normalised(lines[0]), "rpg: error: cannot write " + file + ": " + errno_message(n)) << r.err;
}

class FailingWrites : public ::testing::Test {
 protected:
  void SetUp() override {
    fixture_ = test::oracle_output_dir("tiny_chat_model.py");
    data_ = test::prepare_prompts(dir_.path());
  }
  test::TempDir dir_;
  fs::path fixture_;
  std::string data_;
};

TEST_F(FailingWrites, EveryWriteOfATrainingRunFailsCleanlyAndTheRerunIsBitIdentical) {
  const fs::path whole = dir_ / "whole";
  // Sample generations logged at every step, so samples.jsonl's appends are swept too.
  const auto train_argv = [&](const fs::path& run) {
    auto argv = test::tiny_train_argv(fixture_, data_, run, kSteps, 1);
    argv.push_back("trainer.sample_log_freq=1");
    return argv;
  };
  const auto writes = count_writes(train_argv(whole), dir_ / "writes.txt");
  ASSERT_GT(writes.size(), 20u);
  // Every kind of file the trainer writes is among them.
  for (const std::string kind : {"metrics.jsonl", "samples.jsonl", "rpg.lock", "events.out.tfevents",
                                 "train_state.safetensors", "model.safetensors", "train_state.json",
                                 "latest_checkpointed_iteration.txt", "report.html", "config.yaml"})
    EXPECT_TRUE(std::any_of(writes.begin(), writes.end(), [&](const std::string& w) { return w.find(kind) != std::string::npos; }))
        << "no write of " << kind;
  const std::string want_model = read_file(whole / ("global_step_" + std::to_string(kSteps)) / "actor" / "model.safetensors");
  const auto want_metrics = test::step_metrics(whole / "metrics.jsonl");
  const std::string want_samples = read_file(whole / "samples.jsonl");
  ASSERT_EQ(jsonl::read(whole / "samples.jsonl").size(), static_cast<size_t>(kSteps) * 4) << want_samples;
  std::cerr << writes.size() << " write calls\n";
  for (size_t i = 0; i < writes.size(); ++i) {
    const int n = static_cast<int>(i) + 1;
    SCOPED_TRACE("write " + std::to_string(n) + " of " + std::to_string(writes.size()) + ": " + writes[i] + " " +
                 errno_of(n));
    const fs::path run = dir_ / ("run" + std::to_string(n));
    const std::string run_s = run.string();
    auto r = test::run_process(train_argv(run), {"RPG_TEST_FAIL_WRITE=" + std::to_string(n), std::string("RPG_TEST_FAIL_ERRNO=") + errno_of(n)});
    std::string file = writes[i];
    file.replace(0, whole.string().size(), run_s);  // same layout, other run directory
    expect_write_error(r, n, file);
    EXPECT_EQ(test::temporaries(run), std::vector<std::string>{});
    EXPECT_FALSE(fs::exists(run / "rpg.lock"));
    int newest = test::expect_only_complete_checkpoints(run);
    // The checkpoint the latest marker names (verl's rule; a failure between publishing a
    // checkpoint and updating the marker leaves the marker on the previous one, which is
    // complete too), else the newest.
    if (fs::exists(run / "latest_checkpointed_iteration.txt")) {
      newest = std::stoi(read_file(run / "latest_checkpointed_iteration.txt"));
      EXPECT_TRUE(fs::exists(run / ("global_step_" + std::to_string(newest)) / "train_state.json"));
    }
    // The rerun resumes from that checkpoint and finishes identically.
    r = test::run_process(train_argv(run));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    if (newest > 0) {
      EXPECT_NE(r.err.find("resumed from " + run_s + "/global_step_" + std::to_string(newest) + " at step"),
                std::string::npos)
          << r.err;
    }
    EXPECT_EQ(r.err.find("skipping damaged"), std::string::npos) << r.err;
    EXPECT_EQ(read_file(run / ("global_step_" + std::to_string(kSteps)) / "actor" / "model.safetensors"), want_model);
    EXPECT_EQ(test::step_metrics(run / "metrics.jsonl"), want_metrics);
    // samples.jsonl: a line torn by the failure is dropped on resume, the steps redone once.
    EXPECT_EQ(read_file(run / "samples.jsonl"), want_samples);
    EXPECT_EQ(test::temporaries(run), std::vector<std::string>{});
    fs::remove_all(run);
    if (HasFailure()) break;  // one broken write is enough to read
  }
}

TEST_F(FailingWrites, EveryWriteOfDataPrepareAndModelInitFailsCleanly) {
  struct Command {
    std::vector<std::string> argv;
    fs::path output;
  };
  const fs::path out = dir_ / "out";
  const std::vector<Command> commands = {
      {{test::rpg_binary().string(), "data", "prepare", (dir_ / "p.jsonl").string(), (out / "p.parquet").string(),
        "--data-source", "math_dapo"},
       out / "p.parquet"},
      {{test::rpg_binary().string(), "model", "init", "--tokenizer", (fixture_ / "model").string(), "--output",
        (out / "model").string(), "--hidden", "32", "--layers", "1", "--heads", "2", "--kv-heads", "1",
        "--intermediate", "64"},
       out / "model"},
  };
  for (const auto& c : commands) {
    fs::remove_all(out);
    const auto writes = count_writes(c.argv, dir_ / "writes.txt");
    fs::remove(dir_ / "writes.txt");
    ASSERT_GT(writes.size(), 0u) << c.argv[1];
    const std::string good = fs::is_directory(c.output) ? read_file(c.output / "model.safetensors") : read_file(c.output);
    for (size_t i = 0; i < writes.size(); ++i) {
      const int n = static_cast<int>(i) + 1;
      SCOPED_TRACE(c.argv[1] + " " + c.argv[2] + ": write " + std::to_string(n) + ": " + writes[i]);
      // Over a previous complete output: it must survive the failed rewrite untouched.
      auto r = test::run_process(c.argv, {"RPG_TEST_FAIL_WRITE=" + std::to_string(n),
                                          std::string("RPG_TEST_FAIL_ERRNO=") + errno_of(n)});
      expect_write_error(r, n, writes[i]);
      EXPECT_EQ(test::temporaries(out), std::vector<std::string>{});
      for (const auto& e : fs::directory_iterator(out))
        EXPECT_TRUE(e.path() == c.output) << "left over: " << e.path();
      EXPECT_EQ(fs::is_directory(c.output) ? read_file(c.output / "model.safetensors") : read_file(c.output), good);
    }
  }
}

// A real full disk: a tmpfs big enough for the start of the run but not for its end. The
// tmpfs is mounted inside a user + mount namespace (`unshare --user --map-root-user
// --mount`), which needs no root: the runs happen in there, and the run directory is copied
// out after each for the checks.
TEST_F(FailingWrites, RealFullFilesystemFailsCleanlyAndTheRunFinishesOnceThereIsRoom) {
  // How big a run of kSteps with every checkpoint kept is.
  const fs::path whole = dir_ / "whole";
  auto argv = test::tiny_train_argv(fixture_, data_, whole, kSteps, 1);
  argv.push_back("trainer.max_actor_ckpt_to_keep=null");
  ASSERT_EQ(test::run_process(argv).exit_code, 0);
  uintmax_t total = 0, one = 0;
  for (const auto& e : fs::recursive_directory_iterator(whole))
    if (e.is_regular_file()) total += e.file_size();
  for (const auto& e : fs::recursive_directory_iterator(whole / "global_step_1"))
    if (e.is_regular_file()) one += e.file_size();
  const fs::path mnt = dir_ / "mnt", full = dir_ / "after_full", rerun = dir_ / "after_rerun";
  fs::create_directories(mnt);
  // Room for about two and a half checkpoints: the third (or the fourth) cannot be written.
  const uintmax_t size = (total - kSteps * one) + one * 5 / 2;
  const fs::path run = mnt / "run";
  argv = test::tiny_train_argv(fixture_, data_, run, kSteps, 1);
  argv.push_back("trainer.max_actor_ckpt_to_keep=null");
  auto q = [](const std::string& s) {
    std::string out = "'";
    for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
    return out + "'";
  };
  std::string train;
  for (const auto& arg : argv) train += " " + q(arg);
  const fs::path d = dir_.path();
  test::write_text(d / "full_disk.sh",
                   "set -u\n"
                   "mount -t tmpfs -o size=" + std::to_string(size) + " tmpfs " + q(mnt.string()) + " || exit 90\n" +
                   train + " 2> " + q((d / "full.err").string()) + "; echo $? > " + q((d / "full.code").string()) + "\n" +
                   "cp -a " + q(run.string()) + " " + q(full.string()) + " || exit 91\n" +
                   "mount -o remount,size=" + std::to_string(total * 3) + " tmpfs " + q(mnt.string()) + " || exit 92\n" +
                   train + " 2> " + q((d / "rerun.err").string()) + "; echo $? > " + q((d / "rerun.code").string()) + "\n" +
                   "cp -a " + q(run.string()) + " " + q(rerun.string()) + " || exit 93\n");
  const auto ns = test::run_process({"/usr/bin/unshare", "--user", "--map-root-user", "--mount", "/bin/sh", (d / "full_disk.sh").string()});
  ASSERT_EQ(ns.exit_code, 0) << "the namespace with a small tmpfs could not be set up: " << ns.err;
  const std::string full_err = read_file(d / "full.err");
  EXPECT_EQ(std::stoi(read_file(d / "full.code")), 1) << full_err;
  const auto lines = test::lines_starting(full_err, "rpg: error: ");
  ASSERT_EQ(lines.size(), 1u) << full_err;
  EXPECT_NE(lines[0].find(run.string()), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find("No space left on device (ENOSPC)"), std::string::npos) << lines[0];
  EXPECT_EQ(test::temporaries(full), std::vector<std::string>{});
  const int newest = test::expect_only_complete_checkpoints(full);
  EXPECT_GE(newest, 1);
  EXPECT_LT(newest, kSteps);
  std::cerr << "tmpfs of " << size << " bytes: " << lines[0] << "; newest complete checkpoint " << newest << "\n";
  // More room, and the rerun finishes as an uninterrupted run.
  const std::string rerun_err = read_file(d / "rerun.err");
  ASSERT_EQ(std::stoi(read_file(d / "rerun.code")), 0) << rerun_err;
  EXPECT_NE(rerun_err.find("resumed from " + run.string() + "/global_step_" + std::to_string(newest)), std::string::npos)
      << rerun_err;
  const std::string last = "global_step_" + std::to_string(kSteps);
  EXPECT_EQ(read_file(rerun / last / "actor" / "model.safetensors"),
            read_file(whole / last / "actor" / "model.safetensors"));
  EXPECT_EQ(test::step_metrics(rerun / "metrics.jsonl"), test::step_metrics(whole / "metrics.jsonl"));
}

}  // namespace
}  // namespace rpg
