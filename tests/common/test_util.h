// Helpers shared by every test binary: paths of the build, subprocesses, temporary
// directories, and the venv's Python for live oracles (transformers, verl, ...).
#pragma once

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

namespace rpg::test {

std::filesystem::path source_dir();
std::filesystem::path binary_dir();
std::filesystem::path data_dir();     // data/ in the repository (the paper's eval sets)
std::filesystem::path rpg_binary();   // build/rpg
std::filesystem::path python();       // the venv's python
// Writes `dir`/OUT.parquet from `dir`/p.parquet (rpg's schema) with the venv's pyarrow: the
// Python statements in `edit` see `t` (the table), `i` (the prompt column's index), `pa` and
// `pq`, and leave the new table in `out`. Fails the calling test when Python fails.
void edit_parquet(const std::filesystem::path& dir, const std::string& out, const std::string& edit);

// The TEST / TEST_F / TEST_P / TYPED_TEST declarations of every .cpp file under tests/ (all
// binaries), for docs that cite tests by name.
struct TestDeclaration {
  std::string macro, suite, name;
};
std::vector<TestDeclaration> declared_tests();

struct ProcessResult {
  int exit_code = -1;  // -signal when killed by a signal
  std::string out, err;
};

// Runs argv[0] with the arguments, no shell, stdin from /dev/null; captures both streams.
ProcessResult run_process(const std::vector<std::string>& argv,
                          const std::vector<std::string>& extra_env = {});

// Runs a Python oracle script from tests/oracles with the venv's Python. Fails the calling
// test (via an exception) when Python or the oracle's imports are missing: never skips.
ProcessResult run_oracle(const std::string& script, const std::vector<std::string>& args = {});

// For oracles that build fixtures (models, tokenizers) into a directory: runs
// `script OUT_DIR args...` once per build tree and input, and returns OUT_DIR. Other test
// processes of the same suite (CTest runs each test in its own process) reuse it. The key
// hashes every oracle script and the arguments, so editing an oracle rebuilds its output.
std::filesystem::path oracle_output_dir(const std::string& script, const std::vector<std::string>& args = {});

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

void write_text(const std::filesystem::path& path, const std::string& text);

// This process's resident anonymous memory in KiB, read from its page tables
// (/proc/self/smaps_rollup): /proc/self/status's counters are batched per CPU and lag by MiBs.
long long resident_anonymous_kib();
// Writes n bytes at p where the compiler cannot drop them: a malloc'd block that is only
// written and freed may otherwise be optimised away, allocation and all.
void touch_bytes(void* p, size_t n);

}  // namespace rpg::test
