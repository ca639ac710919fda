#include "rpg/dist/launch.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "rpg/core/error.h"
#include "rpg/core/signals.h"

extern char** environ;

namespace rpg::dist {
namespace {

volatile std::sig_atomic_t g_signal = 0;
void on_signal(int sig) { g_signal = sig; }

struct Stream {
  int fd = -1;
  FILE* sink = nullptr;
  std::string partial;
};

struct Rank {
  int index = 0;  // global rank
  pid_t pid = -1;
  bool running = true;
  int status = 0;
  Stream out, err;
};

void emit(FILE* sink, int rank, const std::string& line) {
  std::string s = str("[rank ", rank, "] ", line, "\n");
  std::fwrite(s.data(), 1, s.size(), sink);
  std::fflush(sink);
}

// Reads what is there; writes every complete line; `eof` flushes the rest.
void drain(Stream& s, int rank) {
  char buf[65536];
  ssize_t n = read(s.fd, buf, sizeof buf);
  if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
  if (n > 0) {
    s.partial.append(buf, static_cast<size_t>(n));
    size_t start = 0, nl;
    while ((nl = s.partial.find('\n', start)) != std::string::npos) {
      emit(s.sink, rank, s.partial.substr(start, nl - start));
      start = nl + 1;
    }
    s.partial.erase(0, start);
    return;
  }
  if (!s.partial.empty()) emit(s.sink, rank, s.partial);
  s.partial.clear();
  close(s.fd);
  s.fd = -1;
}

std::string describe_status(int status) {
  if (WIFEXITED(status)) return str("exited with code ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    const char* name = sigabbrev_np(WTERMSIG(status));
    return str("was killed by signal ", WTERMSIG(status), name ? str(" (SIG", name, ")") : "");
  }
  return "stopped";
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    default: return "a signal";
  }
}

// Ends the ranks started so far and waits for them, so that no child outlives a launch
// that failed while starting (a zombie per rank, or a live rank of an incomplete world
// waiting forever at the rendezvous).
void stop_started(std::vector<Rank>& ranks) {
  for (auto& r : ranks)
    if (r.pid > 0) kill(r.pid, SIGKILL);
  for (auto& r : ranks) {
    if (r.pid > 0)
      while (waitpid(r.pid, nullptr, 0) < 0 && errno == EINTR) {
      }
    for (Stream* s : {&r.out, &r.err})
      if (s->fd >= 0) close(s->fd), s->fd = -1;
  }
}

}  // namespace

int64_t max_local_ranks(std::string* why) {
  const int64_t cores = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
  int64_t limit = cores * 8;
  std::string reason = str("8 per core, ", cores, " cores");
  rlimit rl{};
  if (getrlimit(RLIMIT_NPROC, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
      static_cast<int64_t>(rl.rlim_cur) < limit) {
    limit = static_cast<int64_t>(rl.rlim_cur);
    reason = str("ulimit -u ", rl.rlim_cur);
  }
  if (why) *why = reason;
  return limit;
}

std::string find_program(const std::string& program) {
  if (program.find('/') != std::string::npos) return program;
  const char* path = std::getenv("PATH");
  // POSIX's default search path when PATH is unset (confstr(_CS_PATH)).
  const std::string dirs = path ? path : "/bin:/usr/bin";
  size_t start = 0;
  for (;;) {
    const size_t colon = dirs.find(':', start);
    std::string dir = dirs.substr(start, colon == std::string::npos ? std::string::npos : colon - start);
    if (dir.empty()) dir = ".";  // an empty PATH entry is the current directory
    const std::string candidate = dir + "/" + program;
    struct stat st{};
    if (stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(candidate.c_str(), X_OK) == 0)
      return candidate;
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  throw Error(str("launch: cannot run '", program, "': no executable of that name in PATH"));
}

namespace {

// Binds a listening-style probe to every address at `port` (0: the kernel picks) and
// returns the port bound, or -1 when it is taken. No SO_REUSEADDR: a port some socket
// still holds (TIME_WAIT included) counts as taken.
int probe_port(int port) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw IoError(str("launch: socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  socklen_t len = sizeof addr;
  const bool ok = bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
                  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0;
  const int e = errno;
  close(fd);
  errno = e;
  return ok ? ntohs(addr.sin_port) : -1;
}

// The kernel's ephemeral port range, [first, last] (Linux's default when unreadable).
std::pair<int, int> ephemeral_port_range() {
  std::pair<int, int> range{32768, 60999};  // Linux's default
  if (FILE* f = std::fopen("/proc/sys/net/ipv4/ip_local_port_range", "r")) {
    int lo = 0, hi = 0;
    if (std::fscanf(f, "%d %d", &lo, &hi) == 2 && 0 < lo && lo <= hi && hi <= 65535) range = {lo, hi};
    std::fclose(f);
  }
  return range;
}

}  // namespace

int free_port() {
  // Not from the ephemeral range: the kernel hands those out as the local port of any
  // outgoing connection, so one found free and released there can be taken by another
  // process's connect() before the store binds it (EADDRINUSE; seen with tests in
  // parallel). Ports from 10000 up to the range, and above it, are left to listeners.
  const auto [lo, hi] = ephemeral_port_range();
  std::vector<std::pair<int, int>> spans;  // [first, last]
  if (lo - 1 >= 10000) spans.push_back({10000, lo - 1});
  if (hi + 1 <= 65535) spans.push_back({hi + 1, 65535});
  int total = 0;
  for (auto [a, b] : spans) total += b - a + 1;
  if (total > 0) {
    // A random start, so that concurrent callers rarely probe the same port.
    std::random_device device;
    const int start = static_cast<int>(device() % static_cast<unsigned>(total));
    for (int i = 0; i < std::min(total, 512); ++i) {
      int k = (start + i) % total, port = 0;
      for (auto [a, b] : spans) {
        if (k <= b - a) {
          port = a + k;
          break;
        }
        k -= b - a + 1;
      }
      if (probe_port(port) == port) return port;
    }
  }
  const int port = probe_port(0);
  if (port < 0) throw IoError(str("launch: cannot find a free port: ", std::strerror(errno)));
  return port;
}

void launch(const LaunchOptions& o) {
  if (o.nproc < 1) throw UsageError(str("launch: --nproc must be >= 1, got ", o.nproc));
  if (o.nnodes < 1) throw UsageError(str("launch: --nnodes must be >= 1, got ", o.nnodes));
  if (o.node_rank < 0 || o.node_rank >= o.nnodes)
    throw UsageError(str("launch: --node-rank ", o.node_rank, " is not in [0, ", o.nnodes, ")"));
  if (o.argv.empty()) throw UsageError("launch: no command to run (give it after --)");
  if (o.nnodes > 1 && o.master_port == 0)
    throw UsageError("launch: --master-port is required with --nnodes > 1 (every node must use the same)");
  if (static_cast<int64_t>(o.nnodes) * o.nproc > INT32_MAX)
    throw UsageError(str("launch: --nnodes ", o.nnodes, " x --nproc ", o.nproc, " ranks exceed ", INT32_MAX));
  const std::string program = find_program(o.argv[0]);
  const int port = o.master_port == 0 ? free_port() : o.master_port;
  const int world = o.nnodes * o.nproc;

  // The environment every rank shares: ours minus the launcher variables we set.
  static const char* kOwn[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                               "NODE_RANK", "GROUP_RANK", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT"};
  std::vector<std::string> base;
  bool has_omp = false;
  for (char** e = environ; *e; ++e) {
    std::string kv = *e;
    std::string name = kv.substr(0, kv.find('='));
    bool own = false;
    for (const char* k : kOwn) own = own || name == k;
    if (!own) base.push_back(kv);
    has_omp = has_omp || name == "OMP_NUM_THREADS";
  }
  // As torchrun: one OpenMP thread per rank unless the user chose.
  if (!has_omp && o.nproc > 1) base.push_back(str("OMP_NUM_THREADS=", 1));

  struct sigaction sa{}, old_int{}, old_term{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  g_signal = 0;

  // Grown as ranks start, so that memory follows the ranks that exist.
  std::vector<Rank> ranks;
  ranks.reserve(static_cast<size_t>(std::min(o.nproc, 1024)));
  auto abort_start = [&](const std::string& why) {
    stop_started(ranks);
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    throw Error(str("launch: ", why, " while starting rank ", ranks.size(), " of ", o.nproc, "; the ",
                    ranks.size(), " started rank(s) were killed"));
  };
  for (int k = 0; k < o.nproc; ++k) {
    if (g_signal) abort_start(str("interrupted by ", signal_name(g_signal)));
    Rank& r = ranks.emplace_back();
    r.index = o.node_rank * o.nproc + k;
    std::vector<std::string> env = base;
    for (auto [name, value] : std::initializer_list<std::pair<const char*, std::string>>{
             {"RANK", std::to_string(r.index)},
             {"WORLD_SIZE", std::to_string(world)},
             {"LOCAL_RANK", std::to_string(k)},
             {"LOCAL_WORLD_SIZE", std::to_string(o.nproc)},
             {"MASTER_ADDR", o.master_addr},
             {"MASTER_PORT", std::to_string(port)},
             {"NODE_RANK", std::to_string(o.node_rank)}})
      env.push_back(str(name, "=", value));
    std::vector<char*> envp, args;
    for (auto& e : env) envp.push_back(e.data());
    envp.push_back(nullptr);
    std::vector<std::string> argv = o.argv;
    argv[0] = program;
    for (auto& a : argv) args.push_back(a.data());
    args.push_back(nullptr);

    int out[2] = {-1, -1}, err[2] = {-1, -1};
    if (pipe2(out, O_CLOEXEC) != 0 || pipe2(err, O_CLOEXEC) != 0) {
      const int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1]})
        if (fd >= 0) close(fd);
      ranks.pop_back();
      abort_start(str("pipe: ", std::strerror(e)));
    }
    const pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) {
      const int e = errno;
      for (int fd : {out[0], out[1], err[0], err[1]}) close(fd);
      ranks.pop_back();
      abort_start(str("fork: ", std::strerror(e)));
    }
    if (pid == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (getppid() != parent) _exit(127);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      dup2(out[1], 1);
      dup2(err[1], 2);
      execve(args[0], args.data(), envp.data());
      dprintf(2, "rpg: error: launch: cannot run %s: %s\n", args[0], std::strerror(errno));
      _exit(127);
    }
    close(out[1]);
    close(err[1]);
    r.pid = pid;
    r.out = {out[0], stdout, {}};
    r.err = {err[0], stderr, {}};
  }

  std::optional<size_t> failed;
  int forwarded = 0;
  std::optional<std::chrono::steady_clock::time_point> kill_at;
  auto signal_others = [&](int sig, std::optional<size_t> except) {
    for (size_t i = 0; i < ranks.size(); ++i)
      if (ranks[i].running && (!except || i != *except)) kill(ranks[i].pid, sig);
  };
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<Stream*> streams;
    std::vector<int> owners;
    for (auto& r : ranks)
      for (Stream* s : {&r.out, &r.err})
        if (s->fd >= 0) fds.push_back({s->fd, POLLIN, 0}), streams.push_back(s), owners.push_back(r.index);
    bool any_running = false;
    for (auto& r : ranks) any_running = any_running || r.running;
    if (fds.empty() && !any_running) break;
    int n = poll(fds.data(), fds.size(), fds.empty() ? 50 : 100);
    if (n > 0)
      for (size_t i = 0; i < fds.size(); ++i)
        if (fds[i].revents & (POLLIN | POLLHUP | POLLERR)) drain(*streams[i], owners[i]);
    // Reap.
    for (size_t i = 0; i < ranks.size(); ++i) {
      Rank& r = ranks[i];
      if (!r.running) continue;
      int status = 0;
      pid_t w = waitpid(r.pid, &status, WNOHANG);
      if (w != r.pid) continue;
      r.running = false;
      r.status = status;
      // A preempted rank (exit 75) stopped where the others agreed to stop: they exit 75 too.
      const bool ok = WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == kPreemptedExitCode);
      if (!ok && !failed && !forwarded) {
        failed = i;
        std::fprintf(stderr, "rpg: launch: rank %d %s; stopping the other ranks\n", r.index, describe_status(status).c_str());
        signal_others(SIGTERM, i);
        kill_at = std::chrono::steady_clock::now() + o.grace;
      }
    }
    // A signal to the launcher goes to every rank: the first lets them finish the step, save
    // and exit 75 (core/signals.h; no time limit, as their own would not have one), a second
    // one ends them at once.
    if (g_signal) {
      const int sig = g_signal;
      g_signal = 0;
      signal_others(sig, std::nullopt);
      if (forwarded) kill_at = std::chrono::steady_clock::now() + o.grace;
      forwarded = sig;
    }
    if (kill_at && std::chrono::steady_clock::now() >= *kill_at) {
      signal_others(SIGKILL, std::nullopt);
      kill_at.reset();
    }
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  if (failed) {
    const Rank& r = ranks[*failed];
    throw Error(str("launch: rank ", r.index, " ", describe_status(r.status), " (of ", world, " ranks; the others were stopped)"));
  }
  std::vector<int> preempted;
  bool all_preempted = true;
  for (const Rank& r : ranks) {
    const bool p = WIFEXITED(r.status) && WEXITSTATUS(r.status) == kPreemptedExitCode;
    if (p) preempted.push_back(r.index);
    all_preempted = all_preempted && p;
  }
  if (!preempted.empty()) {
    std::string which;
    for (size_t k = 0; k < preempted.size(); ++k) which += str(k ? ", " : "", preempted[k]);
    if (!all_preempted) throw Error(str("launch: only rank(s) ", which, " of ", world, " stopped on a preemption"));
    throw Preempted(str("launch: every rank stopped on a preemption (exit ", kPreemptedExitCode,
                        "); run the same command again to resume"));
  }
  if (forwarded) throw Error(str("launch: interrupted by signal ", forwarded, "; the ranks were stopped"));
}

}  // namespace rpg::dist
