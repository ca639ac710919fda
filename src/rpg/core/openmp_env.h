// libgomp (libtorch's OpenMP runtime) reads OMP_WAIT_POLICY once, when the process that links
// libtorch loads it, i.e. before rpg-torch's main: the torch-free front binary `rpg` chooses it
// just before it execs rpg-torch. libgomp's default lets a thread that waits at a barrier spin
// for a while before it sleeps. On an idle machine that is the faster choice (the demo, AVX2,
// 2 threads: 2.52 min wall by default, 3.39 min with OMP_WAIT_POLICY=passive, same result);
// on cores that other processes already use, the spinning thread takes the time of the thread
// it waits for (the update bench at load ~11: 13.1 CPU s / 31.9 s wall by default, 5.0 / 14.9
// passive; docs/benchmarks.md). So rpg asks for the passive policy only when the machine is
// already busy; a user's OMP_WAIT_POLICY or GOMP_SPINCOUNT always wins.
#pragma once

#include <optional>
#include <string>

namespace rpg::openmp {

// Whether `threads` more busy threads oversubscribe `cores` already running `others` runnable
// threads of other processes (a snapshot of the run queue, not the 1-minute load average,
// which still counts a run that just ended).
bool oversubscribed(double others, int threads, int cores);

// Runnable threads of other processes now: the median of a few samples of /proc/loadavg's
// running count (which includes the caller), minus the caller. nullopt when unreadable.
std::optional<double> other_runnable_threads();

// Sets OMP_WAIT_POLICY=PASSIVE when neither OMP_WAIT_POLICY nor GOMP_SPINCOUNT is set and the
// machine is oversubscribed for OMP_NUM_THREADS threads (else one per core). Returns why, for
// `rpg version`'s report (passed to rpg-torch in RPG_OMP_WAIT_POLICY_CHOICE).
std::string choose_wait_policy();

}  // namespace rpg::openmp
