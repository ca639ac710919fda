// Test hook (tests only): lets a kill-and-resume test SIGKILL rpg at a chosen point, as a
// crash or a preemption would, instead of hoping a timed kill lands there.
//   RPG_TEST_KILL_AT=<point>:<n>   the process SIGKILLs itself the n-th time (counted from 1
//                                  in this process) it reaches kill_point(<point>)
// Points: `checkpoint_write` (a checkpoint's train_state.safetensors half written, nothing
// published), `generation` (after a decode step of the rollout engine), `optimizer_step`
// (half of the parameters updated). Without the variable a call is one test of a cached flag.
#pragma once

#include <string_view>

namespace rpg::test_hook {

// Throws ConfigError when RPG_TEST_KILL_AT is set but not `<point>:<n>` with n >= 1.
void kill_point(std::string_view point);

}  // namespace rpg::test_hook
