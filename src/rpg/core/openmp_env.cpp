#include "rpg/core/openmp_env.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "rpg/core/error.h"

namespace rpg::openmp {

bool oversubscribed(double others, int threads, int cores) {
  return cores > 0 && others + std::max(threads, 1) > cores;
}

std::optional<double> other_runnable_threads() {
  // /proc/loadavg: "0.52 0.58 0.59 3/456 12345": the 4th field is runnable/total, the caller
  // included. Five samples 2 ms apart smooth a snapshot of a short burst.
  std::vector<double> samples;
  for (int i = 0; i < 5; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    std::ifstream in("/proc/loadavg");
    double a = 0, b = 0, c = 0;
    std::string running;
    if (!(in >> a >> b >> c >> running)) return std::nullopt;
    const size_t slash = running.find('/');
    if (slash == std::string::npos) return std::nullopt;
    try {
      samples.push_back(std::max(0.0, std::stod(running.substr(0, slash)) - 1.0));
    } catch (...) {
      return std::nullopt;
    }
  }
  std::nth_element(samples.begin(), samples.begin() + 2, samples.end());
  return samples[2];
}

std::string choose_wait_policy() {
  if (const char* p = std::getenv("OMP_WAIT_POLICY"); p && *p) return "set by the user";
  if (const char* s = std::getenv("GOMP_SPINCOUNT"); s && *s) return str("GOMP_SPINCOUNT=", s, " set by the user");
  const long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int threads = static_cast<int>(cores);
  if (const char* t = std::getenv("OMP_NUM_THREADS"); t && *t) threads = std::max(1, std::atoi(t));
  // Tests set the run queue they want (the real one depends on the machine's load).
  std::optional<double> others;
  if (const char* t = std::getenv("RPG_TEST_OTHER_RUNNABLE"); t && *t) others = std::atof(t);
  else others = other_runnable_threads();
  if (!others) return "/proc/loadavg unreadable: libgomp's default";
  const bool busy = oversubscribed(*others, threads, static_cast<int>(cores));
  const std::string why = str("chosen by rpg: ", *others, " other runnable threads + ", threads, " here ",
                              busy ? "exceed " : "fit ", cores, " cores");
  if (busy) setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
  return why;
}

}  // namespace rpg::openmp
