#include "rpg/core/test_hook.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <string>
#include <deque>

#include "rpg/core/error.h"

namespace rpg::test_hook {
namespace {

struct Target {
  std::string point;
  int64_t n = 0;
  int sig = SIGKILL;
  std::atomic<int64_t> reached{0};
};

int parse_signal(const std::string& name, const std::string& whole) {
  if (name == "KILL") return SIGKILL;
  if (name == "TERM") return SIGTERM;
  if (name == "INT") return SIGINT;
  throw ConfigError(str("RPG_TEST_KILL_AT: signal must be KILL, TERM or INT, got '", name, "' in '", whole, "'"));
}

int64_t parse_count(const std::string& text, const char* var, const std::string& whole) {
  try {
    size_t used = 0;
    const int64_t n = std::stoll(text, &used);
    if (used == text.size() && n >= 1) return n;
  } catch (const std::exception&) {
  }
  throw ConfigError(str(var, ": expected a count >= 1, got '", text, "' in '", whole, "'"));
}

std::deque<Target>* parse_kill_env() {
  auto* targets = new std::deque<Target>();  // never freed: used until exit
  const char* env = std::getenv("RPG_TEST_KILL_AT");
  if (env == nullptr || *env == '\0') return targets;
  const std::string whole = env;
  size_t start = 0;
  while (start <= whole.size()) {
    const size_t comma = whole.find(',', start);
    const std::string item = whole.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t c1 = item.find(':');
    if (c1 == std::string::npos || c1 == 0)
      throw ConfigError(str("RPG_TEST_KILL_AT: expected <point>:<n>[:<SIG>] with n >= 1 (e.g. checkpoint_write:3), got '",
                            whole, "'"));
    const size_t c2 = item.find(':', c1 + 1);
    Target& t = targets->emplace_back();
    t.point = item.substr(0, c1);
    t.n = parse_count(item.substr(c1 + 1, c2 == std::string::npos ? std::string::npos : c2 - c1 - 1),
                      "RPG_TEST_KILL_AT", whole);
    if (c2 != std::string::npos) t.sig = parse_signal(item.substr(c2 + 1), whole);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return targets;
}

struct WriteFault {
  int64_t n = 0;  // 0: off
  int err = EIO;
  int count_fd = -1;
  std::atomic<int64_t> calls{0};
};

WriteFault* parse_write_env() {
  auto* f = new WriteFault();  // never freed: used until exit
  if (const char* env = std::getenv("RPG_TEST_FAIL_WRITE"); env != nullptr && *env != '\0')
    f->n = parse_count(env, "RPG_TEST_FAIL_WRITE", env);
  if (const char* env = std::getenv("RPG_TEST_FAIL_ERRNO"); env != nullptr && *env != '\0') {
    const std::string e = env;
    if (e == "EIO") f->err = EIO;
    else if (e == "ENOSPC") f->err = ENOSPC;
    else throw ConfigError(str("RPG_TEST_FAIL_ERRNO: expected ENOSPC or EIO, got '", e, "'"));
  }
  if (const char* env = std::getenv("RPG_TEST_COUNT_WRITES"); env != nullptr && *env != '\0') {
    f->count_fd = ::open(env, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (f->count_fd < 0) throw ConfigError(str("RPG_TEST_COUNT_WRITES: cannot open ", env));
  }
  return f;
}

}  // namespace

void kill_point(std::string_view point) {
  static std::deque<Target>* const targets = parse_kill_env();
  for (Target& t : *targets) {
    if (point != t.point) continue;
    // SIGKILL, not exit or abort: no destructor, atexit handler or flush may run, exactly
    // as when the machine is preempted. TERM / INT go to this thread, so the handler has
    // run when raise() returns.
    if (++t.reached == t.n) {
      if (t.sig == SIGKILL) ::kill(::getpid(), SIGKILL);
      else ::raise(t.sig);
    }
  }
}

int write_fault(std::string_view file) {
  static WriteFault* const f = parse_write_env();
  if (f->n == 0 && f->count_fd < 0) return 0;
  const int64_t call = ++f->calls;
  if (f->count_fd >= 0) {
    std::string line(file);
    line += '\n';
    ssize_t ignored = ::write(f->count_fd, line.data(), line.size());
    (void)ignored;
  }
  return call == f->n ? f->err : 0;
}

}  // namespace rpg::test_hook
