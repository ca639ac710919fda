// Test hooks (tests only). Without their environment variables a call is one test of a
// cached flag.
//
// RPG_TEST_KILL_AT lets a kill-and-resume test stop rpg at a chosen point, as a crash or a
// preemption would, instead of hoping a timed signal lands there:
//   RPG_TEST_KILL_AT=<point>:<n>[:<SIG>][,<point>:<n>[:<SIG>]...]
// the process sends itself SIG (KILL when omitted; TERM or INT) the n-th time (counted from
// 1 in this process) it reaches kill_point(<point>). Points: `checkpoint_write` (a
// checkpoint's train_state.safetensors half written, nothing published), `generation`
// (after a decode step of the rollout engine), `optimizer_step` (half of the parameters
// updated). TERM / INT test preemption (core/signals.h): a list such as
// `generation:20:TERM,checkpoint_write:1:TERM` sends a second signal later.
//
// RPG_TEST_FAIL_WRITE=<n> makes the n-th write call (counted from 1 in this process) of
// core/io's writers fail as the OS would, with errno RPG_TEST_FAIL_ERRNO (ENOSPC or EIO;
// EIO when unset). RPG_TEST_COUNT_WRITES=<file> appends one line per write call (the
// file written) to <file>, so a test can sweep n over every write of a run.
#pragma once

#include <string_view>

namespace rpg::test_hook {

// Throws ConfigError when RPG_TEST_KILL_AT is set but malformed.
void kill_point(std::string_view point);

// Called by every write path before it writes to `file`: returns 0 normally, or the errno
// the write must fail with when this is the write RPG_TEST_FAIL_WRITE names. Throws
// ConfigError when the variables are malformed.
int write_fault(std::string_view file);

}  // namespace rpg::test_hook
