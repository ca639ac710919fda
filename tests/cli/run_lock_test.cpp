// One run directory, one writer (train::RunDirLock): a second `rpg train` on a directory
// in use is refused naming the owner; a lock left by a dead process is taken over with a
// warning; a lock of another host is never taken over.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "run_fixture.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

std::string hostname() {
  char host[256] = {};
  gethostname(host, sizeof host - 1);
  return host;
}

class RunLock : public ::testing::Test {
 protected:
  void SetUp() override {
    fixture_ = test::oracle_output_dir("tiny_chat_model.py");
    data_ = test::prepare_prompts(dir_.path());
  }
  test::ProcessResult train(const std::vector<std::string>& env = {}) const {
    return test::run_process(test::tiny_train_argv(fixture_, data_, run_, 2, 1), env);
  }
  test::TempDir dir_;
  fs::path fixture_, run_ = dir_ / "run";
  std::string data_;
};

TEST_F(RunLock, SecondTrainOnALiveOwnersDirectoryIsRefusedNamingTheOwner) {
  // A live owner: a child process that sleeps until killed.
  const pid_t owner = fork();
  if (owner == 0) {
    pause();
    _exit(0);
  }
  fs::create_directories(run_);
  test::write_text(run_ / "rpg.lock", "pid " + std::to_string(owner) + " host " + hostname() + "\n");
  auto r = train();
  kill(owner, SIGKILL);
  waitpid(owner, nullptr, 0);
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_EQ(test::lines_starting(r.err, "rpg: error: "),
            std::vector<std::string>{"rpg: error: trainer.default_local_dir: " + run_.string() +
                                     " is in use by another rpg (pid " + std::to_string(owner) + " on host " +
                                     hostname() + ", lock file " + (run_ / "rpg.lock").string() +
                                     "); use another directory, or delete the lock file if that process is gone"})
      << r.err;
  EXPECT_EQ(test::loadable_checkpoints(run_).size(), 0u) << "the refused run wrote a checkpoint";
  EXPECT_FALSE(fs::exists(run_ / "metrics.jsonl"));
  EXPECT_EQ(read_file(run_ / "rpg.lock"), "pid " + std::to_string(owner) + " host " + hostname() + "\n")
      << "the refused run touched the owner's lock";
}

TEST_F(RunLock, StaleLockOfADeadPidIsTakenOverWithANotice) {
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  waitpid(dead, nullptr, 0);  // reaped: the pid is free
  fs::create_directories(run_);
  test::write_text(run_ / "rpg.lock", "pid " + std::to_string(dead) + " host " + hostname() + "\n");
  auto r = train();
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("taking over the lock of a process that is gone (pid " + std::to_string(dead) + " on host " +
                       hostname() + "): " + (run_ / "rpg.lock").string()),
            std::string::npos)
      << r.err;
  EXPECT_FALSE(fs::exists(run_ / "rpg.lock")) << "not released at exit";
  EXPECT_EQ(test::loadable_checkpoints(run_).size(), 2u);
}

TEST_F(RunLock, LockOfAnotherHostIsNeverTakenOver) {
  fs::create_directories(run_);
  test::write_text(run_ / "rpg.lock", "pid 1 host another-node-0042\n");
  auto r = train();
  EXPECT_EQ(r.exit_code, 1) << r.err;
  EXPECT_NE(r.err.find("is in use by another rpg (pid 1 on host another-node-0042, lock file "), std::string::npos)
      << r.err;
}

}  // namespace
}  // namespace rpg
