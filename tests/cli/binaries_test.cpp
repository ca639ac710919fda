// The two binaries (src/rpg/cli/main.cpp): `rpg` runs the torch-free commands without
// loading libtorch and execs `rpg-torch` (beside it) for the others. The dynamic loader's
// own log (LD_DEBUG=files, on stderr) says which shared libraries a process opened.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <string>
#include <vector>

#include "test_util.h"

namespace rpg {
namespace {

namespace fs = std::filesystem;
using test::ProcessResult;

ProcessResult rpg_traced(const fs::path& binary, std::vector<std::string> args) {
  args.insert(args.begin(), binary.string());
  return test::run_process(args, {"OMP_NUM_THREADS=1", "LD_DEBUG=files"});
}

bool opened_libtorch(const ProcessResult& r) { return r.err.find("file=libtorch_cpu.so") != std::string::npos; }

// The lines of stderr that are not the loader's log.
std::string own_stderr(const std::string& err) {
  std::string out;
  size_t start = 0;
  while (start < err.size()) {
    size_t end = err.find('\n', start);
    if (end == std::string::npos) end = err.size();
    std::string line = err.substr(start, end - start);
    size_t digits = line.find_first_not_of(' ');  // "   1234:\tfile=..."
    bool loader = digits != std::string::npos && line[digits] >= '0' && line[digits] <= '9' &&
                  line.find(":\t") != std::string::npos;
    if (!loader && !line.empty()) out += line + "\n";
    start = end + 1;
  }
  return out;
}

TEST(CliBinaries, TorchFreeCommandsDoNotLoadLibtorch) {
  test::TempDir tmp;
  std::string corpus;
  for (int i = 0; i < 50; ++i) corpus += "the quick brown fox jumps over the lazy dog " + std::to_string(i) + "\n";
  test::write_text(tmp / "corpus.txt", corpus);
  const fs::path rpg = test::rpg_binary();

  ProcessResult help = rpg_traced(rpg, {"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("tokenize"), std::string::npos);
  EXPECT_FALSE(opened_libtorch(help));

  ProcessResult train = rpg_traced(rpg, {"tokenizer", "train", "--corpus", (tmp / "corpus.txt").string(),
                                         "--vocab-size", "300", "--output", (tmp / "tok").string()});
  ASSERT_EQ(train.exit_code, 0) << own_stderr(train.err);
  EXPECT_FALSE(opened_libtorch(train));

  ProcessResult tok = rpg_traced(rpg, {"tokenize", "--model", (tmp / "tok").string(), "the fox"});
  ASSERT_EQ(tok.exit_code, 0) << own_stderr(tok.err);
  EXPECT_NE(tok.out.find(" tokens\n"), std::string::npos) << tok.out;
  EXPECT_FALSE(opened_libtorch(tok));

  ProcessResult bad = rpg_traced(rpg, {"tokenize", "--model", (tmp / "missing").string(), "x"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_EQ(own_stderr(bad.err).rfind("rpg: error: ", 0), 0u) << bad.err;
  EXPECT_FALSE(opened_libtorch(bad));

  // A command that needs libtorch does load it (so the check above can fail), in rpg-torch,
  // with the output, error line and exit status of the command.
  ProcessResult version = rpg_traced(rpg, {"--threads", "2", "version"});
  ASSERT_EQ(version.exit_code, 0) << own_stderr(version.err);
  EXPECT_NE(version.out.find("threads 2 (libtorch intra-op)"), std::string::npos) << version.out;
  EXPECT_TRUE(opened_libtorch(version));
  ProcessResult config = rpg_traced(rpg, {"config", "show", "-", "no.such.key=1"});
  EXPECT_EQ(config.exit_code, 1);
  EXPECT_EQ(own_stderr(config.err).rfind("rpg: error: ", 0), 0u) << config.err;
  EXPECT_NE(config.err.find("no.such.key"), std::string::npos) << config.err;
  EXPECT_TRUE(opened_libtorch(config));
}

TEST(CliBinaries, MissingTorchBinaryIsAOneLineError) {
  test::TempDir tmp;
  fs::copy_file(test::rpg_binary(), tmp / "rpg");
  fs::permissions(tmp / "rpg", fs::perms::owner_all);
  ProcessResult r = test::run_process({(tmp / "rpg").string(), "version"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_EQ(r.err.rfind("rpg: error: " + (tmp / "rpg-torch").string() + ": cannot run it", 0), 0u) << r.err;
  // The torch-free commands still work without it.
  ProcessResult help = test::run_process({(tmp / "rpg").string(), "--help"});
  EXPECT_EQ(help.exit_code, 0) << help.err;
}

}  // namespace
}  // namespace rpg
