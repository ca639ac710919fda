// Preemption: what `rpg train` and `rpg sft` do on SIGTERM / SIGINT (a cluster scheduler's
// "stop now", or Ctrl-C).
//   - The first signal only sets a flag. The training loop polls it between steps: the
//     current step runs to its end (a step is never left half applied), a checkpoint is
//     written (trainer.save_on_preempt, default true), one line is logged and the process
//     exits with kPreemptedExitCode. Bounded time: at most one step plus one checkpoint.
//   - A second signal ends the process at once (its default action, re-raised), as the
//     SIGKILL that follows a grace period would: files are written atomically, so an
//     interrupted checkpoint is never picked up on resume.
#pragma once

#include <string>

#include "rpg/core/error.h"

namespace rpg {

// sysexits.h's EX_TEMPFAIL ("temporary failure, the user is invited to retry"): rerunning
// the same command resumes. Distinct from 0 (done), 1 (error) and 2 (usage).
inline constexpr int kPreemptedExitCode = 75;

// Thrown by a training loop that stopped on a signal, after its checkpoint is written.
// cli/main.cpp prints `rpg: preempted: <message>` and exits with kPreemptedExitCode.
class Preempted : public Error {
 public:
  using Error::Error;
};

namespace signals {

// Installs the SIGTERM / SIGINT handlers described above (idempotent), then unblocks the
// two signals: one that arrived while they were blocked is handled now.
void install_stop_handlers();
// A stop can arrive while the process is still starting: the `rpg` front binary blocks
// SIGTERM / SIGINT just before it execs rpg-torch (a blocked signal stays pending across
// execve, where a handler would be reset), so one sent while libtorch loads and the
// command line is parsed reaches train's / sft's handler (exit 75 after the first step)
// instead of killing the process (exit 143). Every other command unblocks them first
// thing: a pending stop then ends it by the default action, as before.
void block_stop_signals();
void unblock_stop_signals();
// Whether a stop was requested (one signal received).
bool stop_requested();
// The name of the first signal received ("SIGTERM", "SIGINT"), or "" when none.
std::string stop_signal_name();

}  // namespace signals
}  // namespace rpg
