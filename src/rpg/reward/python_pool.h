// verl's custom_reward_function in rpg: a user's Python file with
//   compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)
// returning a number, or a dict with a numeric "score" (other numeric keys are logged), run
// by a pool of persistent worker processes of the user's own Python. Each worker imports
// the file once (reward_worker.py, embedded in rpg) and scores batches sent over a socket.
//
// Why processes and not an embedded interpreter: a function that never returns (a verifier
// stuck in sympy, math-verify's SIGALRM that cannot fire outside the main thread) can only
// be stopped by killing it. A response not scored within timeout_s is killed with its
// worker, scored timeout_score and counted in RewardScores::timeouts; the worker is
// restarted. A function that raises or returns something that is not a number is an error
// naming the file, the function and the Python exception's last line (never a silent 0).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "rpg/reward/scorer.h"

namespace rpg::reward {

struct PythonRewardOptions {
  std::string path;                   // custom_reward_function.path
  std::string name = "compute_score";  // custom_reward_function.name
  std::string python = "python3";     // custom_reward_function.python (searched on PATH without a '/')
  std::string kwargs_json = "{}";     // custom_reward_function.reward_kwargs, passed as **kwargs
  int64_t num_workers = 0;            // reward_model.num_workers; 0: one per core
  double timeout_s = 10.0;            // reward_model.timeout_s, per response
  double timeout_score = 0.0;         // reward_model.timeout_score
  double start_timeout_s = 300.0;     // importing the file (math-verify pulls in sympy: seconds)
  int64_t max_crashes = 2;            // a response whose worker dies this many times stops the run
};

// Starts the workers and waits until each has imported the file, so that a bad file, a
// missing function or a missing Python is reported before any work: ConfigError naming the
// key and, for Python's failures, the exception's last line.
std::unique_ptr<RewardScorer> make_python_scorer(const PythonRewardOptions& options);

// The embedded worker script (reward_worker.py), for tests and `rpg` diagnostics.
const char* reward_worker_source();

}  // namespace rpg::reward
