#include "rpg/core/signals.h"

#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>

namespace rpg::signals {
namespace {

std::atomic<int> g_first_signal{0};
std::atomic<int> g_count{0};

void write_stderr(const char* s) {
  // write(2) is async-signal-safe; stdio is not.
  ssize_t ignored = ::write(STDERR_FILENO, s, ::strlen(s));
  (void)ignored;
}

extern "C" void on_stop_signal(int sig) {
  if (g_count.fetch_add(1) == 0) {
    // Silent: the loop logs the one line when it stops.
    g_first_signal.store(sig);
    return;
  }
  write_stderr("rpg: second signal: exiting at once\n");
  // The default action (terminate by this signal): what the sender expects to see.
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

}  // namespace

void install_stop_handlers() {
  static std::atomic<bool> installed{false};
  if (installed.exchange(true)) return;
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // blocking reads and writes resume; the loop polls the flag
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGINT, &sa, nullptr);
  unblock_stop_signals();
}

namespace {
void set_stop_signals_blocked(bool blocked) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  ::pthread_sigmask(blocked ? SIG_BLOCK : SIG_UNBLOCK, &set, nullptr);
}
}  // namespace

void block_stop_signals() { set_stop_signals_blocked(true); }
void unblock_stop_signals() { set_stop_signals_blocked(false); }

bool stop_requested() { return g_count.load(std::memory_order_relaxed) > 0; }

std::string stop_signal_name() {
  switch (g_first_signal.load()) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case 0: return "";
    default: return "signal " + std::to_string(g_first_signal.load());
  }
}

}  // namespace rpg::signals
