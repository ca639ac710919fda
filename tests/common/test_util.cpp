#include "test_util.h"

#include <fcntl.h>
#include <sys/file.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <iterator>
#include <random>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "rpg/core/build_info.h"

namespace fs = std::filesystem;

extern char** environ;

namespace rpg::test {

// RPG_TEST_SOURCE_DIR / RPG_TEST_BINARY_DIR / RPG_TEST_PYTHON override the paths compiled
// in, for test binaries carried to another machine (scripts/gpu_check.sh).
static fs::path env_or(const char* name, const char* compiled) {
  const char* v = std::getenv(name);
  return v && *v ? fs::path(v) : fs::path(compiled);
}
fs::path source_dir() { return env_or("RPG_TEST_SOURCE_DIR", RPG_SOURCE_DIR); }
fs::path binary_dir() { return env_or("RPG_TEST_BINARY_DIR", RPG_BINARY_DIR); }
fs::path data_dir() { return source_dir() / "data"; }
fs::path rpg_binary() { return binary_dir() / "rpg"; }
fs::path python() { return env_or("RPG_TEST_PYTHON", RPG_PYTHON_PATH); }

void edit_parquet(const fs::path& dir, const std::string& out, const std::string& edit) {
  const auto r = run_process({python().string(), "-c",
                              "import sys, pyarrow as pa, pyarrow.parquet as pq\n"
                              "t = pq.read_table(sys.argv[1] + '/p.parquet')\n"
                              "i = t.schema.get_field_index('prompt')\n" +
                                  edit + "\npq.write_table(out, sys.argv[1] + '/' + sys.argv[2])\n",
                              dir.string(), out});
  if (r.exit_code != 0) throw std::runtime_error("edit_parquet " + out + ": " + r.err);
}

ProcessResult run_process(const std::vector<std::string>& argv, const std::vector<std::string>& extra_env) {
  if (argv.empty()) throw std::invalid_argument("run_process: empty argv");
  int out_pipe[2], err_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) != 0 || pipe2(err_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));

  std::vector<std::string> env_strings;
  for (char** e = environ; *e; ++e) env_strings.emplace_back(*e);
  for (const auto& e : extra_env) env_strings.push_back(e);
  std::vector<char*> envp, args;
  for (auto& e : env_strings) envp.push_back(e.data());
  envp.push_back(nullptr);
  std::vector<std::string> argv_copy = argv;
  for (auto& a : argv_copy) args.push_back(a.data());
  args.push_back(nullptr);

  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    execve(args[0], args.data(), envp.data());
    dprintf(2, "exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  ProcessResult r;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  char buf[65536];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
  return r;
}

ProcessResult run_oracle(const std::string& script, const std::vector<std::string>& args) {
  fs::path py = python();
  if (!fs::exists(py))
    throw std::runtime_error("oracle Python missing at " + py.string() + " (run scripts/setup.sh)");
  std::vector<std::string> argv = {py.string(), (source_dir() / "tests" / "oracles" / script).string()};
  argv.insert(argv.end(), args.begin(), args.end());
  ProcessResult r = run_process(argv, {"PYTHONHASHSEED=0", "HF_HUB_OFFLINE=1", "TRANSFORMERS_OFFLINE=1"});
  if (r.exit_code != 0)
    throw std::runtime_error("oracle " + script + " failed (exit " + std::to_string(r.exit_code) + "): " + r.err);
  return r;
}

namespace {
uint64_t fnv1a(std::string_view data, uint64_t h = 1469598103934665603ull) {
  for (unsigned char c : data) h = (h ^ c) * 1099511628211ull;
  return h;
}
}  // namespace

fs::path oracle_output_dir(const std::string& script, const std::vector<std::string>& args) {
  uint64_t key = fnv1a(script);
  std::vector<fs::path> oracles;
  for (const auto& e : fs::directory_iterator(source_dir() / "tests" / "oracles"))
    if (e.path().extension() == ".py") oracles.push_back(e.path());
  std::sort(oracles.begin(), oracles.end());
  for (const auto& p : oracles) {
    std::ifstream in(p, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    key = fnv1a(p.filename().string() + "\n" + text, key);
  }
  for (const auto& a : args) key = fnv1a(a + "\n", key);
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(key));
  const fs::path root = binary_dir() / "oracle-cache";
  fs::create_directories(root);
  const fs::path out = root / (fs::path(script).stem().string() + "-" + hex);
  // One process builds; the others wait on the lock and then find the result.
  int lock = open((root / (out.filename().string() + ".lock")).c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644);
  if (lock < 0) throw std::runtime_error("cannot open oracle cache lock in " + root.string());
  flock(lock, LOCK_EX);
  if (!fs::exists(out)) {
    fs::path tmp = out;
    tmp += ".tmp";
    fs::remove_all(tmp);
    fs::create_directories(tmp);
    std::vector<std::string> full = {tmp.string()};
    full.insert(full.end(), args.begin(), args.end());
    try {
      run_oracle(script, full);
    } catch (...) {
      fs::remove_all(tmp);
      close(lock);
      throw;
    }
    fs::rename(tmp, out);
  }
  close(lock);
  return out;
}

TempDir::TempDir() {
  std::random_device rd;
  for (int attempt = 0; attempt < 100; ++attempt) {
    fs::path p = fs::temp_directory_path() / ("rpg-test-" + std::to_string(getpid()) + "-" + std::to_string(rd()));
    std::error_code ec;
    if (fs::create_directory(p, ec)) {
      path_ = p;
      return;
    }
  }
  throw std::runtime_error("cannot create a temporary directory");
}

TempDir::~TempDir() {
  std::error_code ec;
  fs::remove_all(path_, ec);
}

void write_text(const fs::path& path, const std::string& text) {
  fs::create_directories(path.parent_path());
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

void touch_bytes(void* p, size_t n) {
  std::memset(p, 1, n);
  asm volatile("" : : "r"(p) : "memory");
}

long long resident_anonymous_kib() {
  std::ifstream in("/proc/self/smaps_rollup");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("Anonymous:", 0) == 0) return std::stoll(line.substr(10));
  throw std::runtime_error("no Anonymous: line in /proc/self/smaps_rollup");
}

std::vector<TestDeclaration> declared_tests() {
  static const std::regex decl(R"(\b(TEST|TEST_F|TEST_P|TYPED_TEST)\(\s*([A-Za-z_]\w*)\s*,\s*([A-Za-z_]\w*)\s*\))");
  std::vector<TestDeclaration> out;
  for (const auto& e : fs::recursive_directory_iterator(source_dir() / "tests")) {
    if (e.path().extension() != ".cpp") continue;
    std::ifstream in(e.path());
    std::stringstream text;
    text << in.rdbuf();
    const std::string s = text.str();
    for (std::sregex_iterator it(s.begin(), s.end(), decl), end; it != end; ++it)
      out.push_back({(*it)[1].str(), (*it)[2].str(), (*it)[3].str()});
  }
  return out;
}

}  // namespace rpg::test
