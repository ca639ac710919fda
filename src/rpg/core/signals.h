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

// Installs the SIGTERM / SIGINT handlers described above (idempotent).
void install_stop_handlers();
// Whether a stop was requested (one signal received).
bool stop_requested();
// The name of the first signal received ("SIGTERM", "SIGINT"), or "" when none.
std::string stop_signal_name();

}  // namespace signals
}  // namespace rpg
