#include "rpg/core/test_hook.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "rpg/core/error.h"

namespace rpg::test_hook {
namespace {

struct Target {
  bool armed = false;
  std::string point;
  int64_t n = 0;
};

Target parse_env() {
  Target t;
  const char* env = std::getenv("RPG_TEST_KILL_AT");
  if (env == nullptr || *env == '\0') return t;
  const std::string v = env;
  const auto colon = v.rfind(':');
  try {
    if (colon == std::string::npos || colon == 0) throw std::invalid_argument("no point");
    size_t used = 0;
    t.n = std::stoll(v.substr(colon + 1), &used);
    if (used != v.size() - colon - 1 || t.n < 1) throw std::invalid_argument("bad count");
  } catch (const std::exception&) {
    throw ConfigError(str("RPG_TEST_KILL_AT: expected <point>:<n> with n >= 1 (e.g. checkpoint_write:3), got '", v, "'"));
  }
  t.point = v.substr(0, colon);
  t.armed = true;
  return t;
}

}  // namespace

void kill_point(std::string_view point) {
  static const Target target = parse_env();
  static std::atomic<int64_t> reached{0};
  if (!target.armed || point != target.point) return;
  // SIGKILL, not exit or abort: no destructor, atexit handler or flush may run, exactly as
  // when the machine is preempted.
  if (++reached == target.n) ::kill(::getpid(), SIGKILL);
}

}  // namespace rpg::test_hook
