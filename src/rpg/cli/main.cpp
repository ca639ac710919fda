// `rpg <command> [args]`. The one place that catches rpg's exceptions: a failure prints
// one line `rpg: error: <message>` on stderr and exits 2 (usage) or 1 (anything else).
//
// Global options, before the command: `--threads N` (or the environment variable
// RPG_NUM_THREADS; the flag wins) sets libtorch's intra-op thread count before any tensor
// work, i.e. before libtorch's OpenMP pool spawns its threads.
//
// Compiled twice (src/rpg/cli/CMakeLists.txt). With RPG_CLI_FRONT it is `rpg`, a binary
// without libtorch: it runs the torch-free commands itself (a tokenizer or data command
// pays neither libtorch's ~0.7 s load nor its ~130 MiB) and replaces itself (execv: same
// process id, standard streams and exit status) by `rpg-torch` from its own directory for
// the commands that need libtorch, with the same arguments. Without it, it is `rpg-torch`,
// which runs every command.
#ifndef RPG_CLI_FRONT
#include <ATen/Parallel.h>
#endif

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <new>
#include <optional>
#include <string>
#include <vector>

#include "rpg/cli/commands.h"
#include "rpg/core/build_info.h"
#include "rpg/core/config.h"
#include "rpg/core/error.h"
#include "rpg/core/malloc_env.h"
#include "rpg/core/openmp_env.h"
#include "rpg/core/signals.h"
#include "rpg/core/test_hook.h"

namespace {

void print_help() {
  std::cout << "usage: rpg <command> [args]\n\n"
               "rpg: KL-regularized policy-gradient RL post-training for LLM reasoning (RPG, GRPO, DAPO,\n"
               "REINFORCE++) in one C++ program.\n\ncommands:\n";
  for (const auto& c : rpg::cli::commands()) {
    std::string name = "  " + c.name;
    if (name.size() < 22) name.resize(22, ' ');
    std::cout << name << c.summary << "\n";
  }
  std::cout << "\nglobal options (before the command):\n"
               "  --threads N           libtorch intra-op (OpenMP) threads; default: $RPG_NUM_THREADS, else\n"
               "                        libtorch's own default (OMP_NUM_THREADS or the core count)\n"
               "\n'rpg <command> --help' describes a command.  rpg --version prints versions.\n";
}

std::string first_line(const char* what) {
  std::string s = what ? what : "";
  // libtorch errors carry a backtrace after the first line.
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

int fail(int code, const std::string& message) {
  std::cout.flush();
  std::fprintf(stderr, "rpg: error: %s\n", message.c_str());
  return code;
}

// A thread count from `what` (the flag or the variable, named in the error): 1..4096.
int parse_threads(const std::string& value, const std::string& what) {
  int64_t n = 0;
  bool ok = !value.empty() && value.size() <= 6;
  for (char ch : value) ok = ok && ch >= '0' && ch <= '9';
  if (ok) n = std::stoll(value);
  if (!ok || n < 1 || n > 4096)
    throw rpg::UsageError(rpg::str(what, ": got '", value, "', expected a thread count from 1 to 4096"));
  return static_cast<int>(n);
}

// Removes the global options from the front of `args` and applies them. The thread count
// goes to at::set_num_threads (OpenMP + MKL of this process) and to OMP_NUM_THREADS /
// MKL_NUM_THREADS for any child process. Called before any libtorch computation, so the
// OpenMP pool is created with this size rather than grown or shrunk later.
void apply_global_options(std::vector<std::string>& args) {
  std::optional<int> threads;
  if (const char* env = std::getenv("RPG_NUM_THREADS"); env && *env) threads = parse_threads(env, "RPG_NUM_THREADS");
  size_t i = 0;
  while (i < args.size()) {
    if (args[i] == "--threads") {
      if (i + 1 >= args.size()) throw rpg::UsageError("--threads: missing value (a thread count from 1 to 4096)");
      threads = parse_threads(args[i + 1], "--threads");
      i += 2;
    } else if (args[i].starts_with("--threads=")) {
      threads = parse_threads(args[i].substr(10), "--threads");
      i += 1;
    } else {
      break;
    }
  }
  args.erase(args.begin(), args.begin() + static_cast<std::ptrdiff_t>(i));
  if (threads) {
    const std::string n = std::to_string(*threads);
    setenv("OMP_NUM_THREADS", n.c_str(), 1);
    setenv("MKL_NUM_THREADS", n.c_str(), 1);
#ifndef RPG_CLI_FRONT
    at::set_num_threads(*threads);
#endif
  }
}

// The command with the longest name that the arguments start with (its word count in
// *words), or nullptr.
const rpg::cli::Command* match_command(const std::vector<std::string>& args, size_t* words_out) {
  const rpg::cli::Command* best = nullptr;
  size_t best_words = 0;
  for (const auto& c : rpg::cli::commands()) {
    std::vector<std::string> words;
    size_t start = 0;
    while (start <= c.name.size()) {
      size_t sp = c.name.find(' ', start);
      words.push_back(c.name.substr(start, sp == std::string::npos ? std::string::npos : sp - start));
      if (sp == std::string::npos) break;
      start = sp + 1;
    }
    if (words.size() > args.size() || words.size() <= best_words) continue;
    bool match = true;
    for (size_t i = 0; i < words.size() && match; ++i) match = words[i] == args[i];
    if (match) best = &c, best_words = words.size();
  }
  *words_out = best_words;
  return best;
}

#ifdef RPG_CLI_FRONT
// The command needs libtorch: become rpg-torch (beside this binary) with the same arguments.
[[noreturn]] void exec_torch_binary(char** argv) {
  std::error_code ec;
  std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) self = argv[0];
  const std::string torch = (self.parent_path() / "rpg-torch").string();
  argv[0] = const_cast<char*>(torch.c_str());
  // libgomp reads its wait policy when rpg-torch loads it: the last moment to choose it.
  const std::string policy = rpg::openmp::choose_wait_policy();
  setenv("RPG_OMP_WAIT_POLICY_CHOICE", policy.c_str(), 1);
  std::cout.flush();
  rpg::signals::block_stop_signals();  // a stop while rpg-torch starts stays pending (core/signals.h)
  execv(torch.c_str(), argv);
  rpg::signals::unblock_stop_signals();
  throw rpg::IoError(rpg::str(torch, ": cannot run it (", std::strerror(errno),
                              "); the commands that need libtorch are in that binary: build the rpg target"));
}
#endif

int dispatch(std::vector<std::string> args, [[maybe_unused]] char** argv) {
  apply_global_options(args);
#ifndef RPG_CLI_FRONT
  rpg::test_hook::kill_point("startup");  // tests: a stop signal that arrives while rpg-torch starts
#endif
  {
    // The front binary blocked SIGTERM / SIGINT before exec'ing this one: they stay blocked
    // only until a command that handles them has installed its handlers.
    size_t words = 0;
    const rpg::cli::Command* c = match_command(args, &words);
    if (!c || !c->handles_stop_signals) rpg::signals::unblock_stop_signals();
  }
  if (args.empty()) {
    print_help();
    return 2;
  }
  if (args[0] == "--help" || args[0] == "-h" || args[0] == "help") {
    print_help();
    return 0;
  }
#ifdef RPG_CLI_FRONT
  if (args[0] == "--version") exec_torch_binary(argv);
#else
  if (args[0] == "--version") return rpg::cli::run_version("rpg --version", {});
#endif

  size_t best_words = 0;
  const rpg::cli::Command* best = match_command(args, &best_words);
  if (!best) {
    // A group word alone ("rpg config") lists its subcommands.
    std::vector<std::string> names, group;
    for (const auto& c : rpg::cli::commands()) {
      names.push_back(c.name);
      names.push_back(c.name.substr(0, c.name.find(' ')));  // group word of "config show"
      if (c.name.starts_with(args[0] + " ")) group.push_back(c.name);
    }
    if (!group.empty()) {
      std::string list;
      for (const auto& g : group) list += (list.empty() ? "" : ", ") + ("'rpg " + g + "'");
      throw rpg::UsageError(rpg::str("'rpg ", args[0], "' needs a subcommand: ", list));
    }
    std::string hint = rpg::nearest(args[0], names);
    throw rpg::UsageError(rpg::str("unknown command '", args[0], "'",
                                   hint.empty() ? "" : rpg::str("; did you mean '", hint, "'?"),
                                   " (see 'rpg --help')"));
  }
#ifdef RPG_CLI_FRONT
  if (!best->run) exec_torch_binary(argv);
#endif
  std::vector<std::string> rest(args.begin() + static_cast<std::ptrdiff_t>(best_words), args.end());
  return best->run("rpg " + best->name, rest);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
#ifndef RPG_CLI_FRONT
  rpg::malloc_env::keep_freed_memory();  // before the first tensor (core/malloc_env.h)
#endif
  try {
    return dispatch(args, argv);
  } catch (const rpg::Preempted& e) {
    std::cout.flush();
    std::fprintf(stderr, "rpg: preempted: %s\n", e.what());
    return rpg::kPreemptedExitCode;
  } catch (const rpg::UsageError& e) {
    return fail(2, e.what());
  } catch (const rpg::Error& e) {
    return fail(1, e.what());
  } catch (const std::bad_alloc&) {
    return fail(1, "out of memory");
  } catch (const std::exception& e) {
    return fail(1, "internal: " + first_line(e.what()));
  } catch (...) {
    return fail(1, "internal: unknown exception");
  }
}
