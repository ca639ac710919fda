// The Python reward pool (verl's custom_reward_function): scores equal the function called
// directly in Python (tests/oracles/reward_custom_direct.py, math-verify from the venv as the
// real example); hanging, raising, crashing and malformed functions; no worker outlives it.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rpg/core/error.h"
#include "rpg/reward/python_pool.h"
#include "test_util.h"

namespace rpg::test {
namespace {

namespace fs = std::filesystem;
using reward::ScoreRequest;

reward::PythonRewardOptions options(const fs::path& file, int64_t workers = 2) {
  reward::PythonRewardOptions o;
  o.path = file.string();
  o.python = python().string();
  o.num_workers = workers;
  return o;
}

struct Owned {
  std::vector<std::string> data_source, response, ground_truth, extra_info;
  std::vector<ScoreRequest> requests() const {
    std::vector<ScoreRequest> out;
    for (size_t i = 0; i < response.size(); ++i)
      out.push_back({data_source[i], response[i], ground_truth[i], extra_info[i]});
    return out;
  }
  void add(std::string ds, std::string resp, std::string gt, std::string extra = "") {
    data_source.push_back(std::move(ds));
    response.push_back(std::move(resp));
    ground_truth.push_back(std::move(gt));
    extra_info.push_back(std::move(extra));
  }
};

// Running: exists and is not a zombie (an orphan's zombie lingers where PID 1 does not reap).
bool alive(pid_t pid) {
  if (::kill(pid, 0) != 0) return false;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  const size_t paren = text.rfind(')');
  return paren == std::string::npos || paren + 2 >= text.size() || text[paren + 2] != 'Z';
}

std::vector<pid_t> recorded_pids(const fs::path& dir) {
  std::vector<pid_t> pids;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().starts_with("pid-"))
      pids.push_back(static_cast<pid_t>(std::stol(e.path().filename().string().substr(4))));
  return pids;
}

// 1,000 responses to math problems, right and wrong in the ways math-verify cares about.
Owned math_corpus() {
  Owned q;
  const std::vector<std::pair<std::string, std::string>> answers{
      {"\\frac{1}{2}", "0.5"}, {"\\frac{1}{2}", "\\frac12"}, {"3", "3.0"}, {"\\sqrt{2}", "2^{1/2}"},
      {"x^2+1", "1+x^2"}, {"(1,2)", "(1, 2)"}, {"\\pi", "3.14159"}, {"10", "9"}, {"2x", "x+x"}, {"-1", "1"}};
  for (int i = 0; i < 1000; ++i) {
    const auto& [gt, alt] = answers[static_cast<size_t>(i) % answers.size()];
    std::string response;
    switch (i % 5) {
      case 0: response = "The answer is $\\boxed{" + gt + "}$."; break;
      case 1: response = "So we get \\boxed{" + alt + "}"; break;
      case 2: response = "I think it is " + std::to_string(i) + "."; break;
      case 3: response = "Answer: $" + alt + "$"; break;
      default: response = "no idea"; break;
    }
    q.add(i % 2 ? "lighteval/MATH" : "my_task", response, gt,
          nlohmann::json{{"index", i}, {"split", "test"}}.dump());
  }
  return q;
}

TEST(RewardPython, MathVerifyThroughThePoolEqualsTheFunctionCalledDirectly) {
  TempDir dir;
  const fs::path file = dir / "mv_reward.py";
  write_text(file,
             "from math_verify import parse, verify\n"
             "def compute_score(data_source, solution_str, ground_truth, extra_info=None, bonus=0.0):\n"
             "    ok = verify(parse('$' + ground_truth + '$'), parse(solution_str))\n"
             "    return {'score': float(ok) + bonus, 'acc': bool(ok), 'index': extra_info['index'],\n"
             "            'len': len(solution_str), 'source': data_source}\n");
  const Owned q = math_corpus();
  {
    std::ofstream jl(dir / "requests.jsonl");
    for (size_t i = 0; i < q.response.size(); ++i)
      jl << nlohmann::json{{"data_source", q.data_source[i]}, {"solution_str", q.response[i]},
                           {"ground_truth", q.ground_truth[i]},
                           {"extra_info", nlohmann::json::parse(q.extra_info[i])}}
                .dump()
         << "\n";
  }
  const std::string kwargs = R"({"bonus": 0.25})";
  const auto direct = run_oracle("reward_custom_direct.py",
                                 {file.string(), "compute_score", (dir / "requests.jsonl").string(), kwargs});
  ASSERT_EQ(direct.exit_code, 0) << direct.err;

  auto o = options(file);
  o.kwargs_json = kwargs;
  auto scorer = reward::make_python_scorer(o);
  const auto requests = q.requests();
  const auto got = scorer->score(requests);
  ASSERT_EQ(got.results.size(), requests.size());
  EXPECT_EQ(got.timeouts, 0);
  std::istringstream lines(direct.out);
  std::string line;
  size_t i = 0, right = 0;
  for (; std::getline(lines, line); ++i) {
    ASSERT_LT(i, requests.size());
    const auto want = nlohmann::json::parse(line);
    EXPECT_EQ(got.results[i].score, want["score"].get<double>()) << "response " << i << ": " << q.response[i];
    EXPECT_EQ(got.results[i].acc, want["acc"].get<bool>()) << i;
    EXPECT_EQ(got.extra.at("index")[i], want["index"].get<double>()) << i;
    EXPECT_EQ(got.extra.at("len")[i], want["len"].get<double>()) << i;
    right += want["acc"].get<bool>();
  }
  EXPECT_EQ(i, requests.size());
  EXPECT_EQ(got.extra.count("source"), 0u) << "a string value is not a metric";
  // The corpus must exercise both outcomes, or equality would prove little.
  EXPECT_GT(right, 200u);
  EXPECT_LT(right, 800u);
}

TEST(RewardPython, NumbersBoolsPredAndExtraKeys) {
  TempDir dir;
  const fs::path file = dir / "r.py";
  write_text(file,
             "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
             "    if solution_str == 'int': return 3\n"
             "    if solution_str == 'bool': return True\n"
             "    if solution_str == 'neg': return -0.5\n"
             "    if solution_str == 'dict': return {'score': 0, 'acc': 1, 'pred': 'x', 'f': 2.5}\n"
             "    return {'score': 1.0, 'g': False}\n");
  Owned q;
  for (const char* s : {"int", "bool", "neg", "dict", "other"}) q.add("any", s, "gt");
  auto scorer = reward::make_python_scorer(options(file, 1));
  const auto r = scorer->score(q.requests());
  EXPECT_EQ(r.results[0].score, 3.0);
  EXPECT_TRUE(r.results[0].acc);  // no 'acc': score > 0
  EXPECT_EQ(r.results[1].score, 1.0);
  EXPECT_EQ(r.results[2].score, -0.5);
  EXPECT_FALSE(r.results[2].acc);
  EXPECT_EQ(r.results[3].score, 0.0);
  EXPECT_TRUE(r.results[3].acc);
  EXPECT_EQ(r.results[3].pred, "x");
  EXPECT_EQ(r.extra.at("f")[3], 2.5);
  EXPECT_TRUE(std::isnan(r.extra.at("f")[4]));
  EXPECT_EQ(r.extra.at("g")[4], 0.0);
  // The pool persists: a second call reuses the imported workers.
  EXPECT_EQ(scorer->score(q.requests()).results[0].score, 3.0);
}

TEST(RewardPython, AFunctionThatNeverReturnsIsTimedOutAndItsWorkerKilled) {
  TempDir dir;
  const fs::path file = dir / "hang.py";
  write_text(file,
             "import os, time\n"
             "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
             "    open(os.path.join(" + nlohmann::json(dir.path().string()).dump() +
                 ", f'pid-{os.getpid()}'), 'w').close()\n"
             "    if solution_str == 'hang':\n"
             "        while True: time.sleep(60)\n"
             "    return len(solution_str)\n");
  Owned q;
  for (int i = 0; i < 30; ++i) q.add("any", i % 10 == 3 ? "hang" : std::string(static_cast<size_t>(i), 'a'), "");
  auto o = options(file, 3);
  o.timeout_s = 1.0;
  o.timeout_score = -7;
  auto scorer = reward::make_python_scorer(o);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = scorer->score(q.requests());
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(r.timeouts, 3);
  for (int i = 0; i < 30; ++i) {
    if (i % 10 == 3) {
      EXPECT_EQ(r.results[static_cast<size_t>(i)].score, -7.0) << i;
      EXPECT_FALSE(r.results[static_cast<size_t>(i)].acc);
    } else {
      EXPECT_EQ(r.results[static_cast<size_t>(i)].score, static_cast<double>(i)) << i;
    }
  }
  // A hang guard, not a speed requirement: three one-second timeouts plus restarts.
  EXPECT_LT(elapsed, 3 * o.timeout_s + 20) << "the step must not wait for the hung function";
  const auto pids = recorded_pids(dir.path());
  size_t dead = 0;
  for (pid_t p : pids) dead += !alive(p);
  EXPECT_GE(dead, 3u) << "the workers that hung must be killed and reaped";
  scorer.reset();
  for (pid_t p : recorded_pids(dir.path())) EXPECT_FALSE(alive(p)) << "worker " << p << " outlived the pool";
}

void expect_one_line_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    for (const auto& p : parts) EXPECT_NE(m.find(p), std::string::npos) << "'" << p << "' missing from: " << m;
  }
}

TEST(RewardPython, ProcessesAHungFunctionStartedDieWithItsWorker) {
  TempDir dir;
  const fs::path file = dir / "spawns.py";
  const std::string marks = nlohmann::json(dir.path().string()).dump();
  write_text(file,
             "import os, subprocess, time\n"
             "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
             "    child = subprocess.Popen(['sleep', '300'])\n"
             "    open(os.path.join(" + marks + ", f'pid-{child.pid}'), 'w').close()\n"
             "    while True: time.sleep(60)\n");
  Owned q;
  q.add("any", "x", "");
  auto o = options(file, 1);
  o.timeout_s = 1.0;
  auto scorer = reward::make_python_scorer(o);
  EXPECT_EQ(scorer->score(q.requests()).timeouts, 1);
  const auto children = recorded_pids(dir.path());
  ASSERT_EQ(children.size(), 1u);
  // Killed with the worker's process group; give init a moment to reap the orphan.
  bool gone = false;
  for (int i = 0; i < 100 && !gone; ++i) {
    gone = !alive(children[0]);
    if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(gone) << "the function's own child process " << children[0] << " outlived its killed worker";
}

TEST(RewardPython, BrokenFunctionsAreOneLineErrorsNamingFileFunctionAndException) {
  TempDir dir;
  Owned q;
  q.add("any", "x", "y");
  const auto score_with = [&](const std::string& name, const std::string& body, const std::string& fn) {
    const fs::path file = dir / name;
    write_text(file, body);
    auto o = options(file, 1);
    o.name = fn;
    return [o, &q] { reward::make_python_scorer(o)->score(q.requests()); };
  };
  const std::string file_raises = (dir / "raises.py").string();
  expect_one_line_error(score_with("raises.py", "def compute_score(*a, **k):\n    raise ValueError('boom\\nline two')\n",
                                   "compute_score"),
                        {file_raises, "compute_score", "raised ValueError: boom line two", "response 0"});
  expect_one_line_error(score_with("string.py", "def compute_score(*a, **k):\n    return 'one'\n", "compute_score"),
                        {"string.py:compute_score", "returned str ('one')"});
  expect_one_line_error(score_with("nan.py", "def compute_score(*a, **k):\n    return float('nan')\n", "compute_score"),
                        {"nan.py:compute_score", "returned nan"});
  expect_one_line_error(score_with("nodict.py", "def compute_score(*a, **k):\n    return {'acc': 1}\n", "compute_score"),
                        {"nodict.py", "without 'score'"});
  expect_one_line_error(score_with("missing.py", "def other(*a, **k):\n    return 1\n", "compute_score"),
                        {"missing.py:compute_score", "has no function 'compute_score'"});
  expect_one_line_error(score_with("syntax.py", "def compute_score(:\n", "compute_score"),
                        {"syntax.py:compute_score", "cannot import it: SyntaxError"});
  expect_one_line_error(score_with("imports.py", "import no_such_module_rpg\n", "compute_score"),
                        {"imports.py", "ModuleNotFoundError: No module named 'no_such_module_rpg'"});
  {
    auto o = options(dir / "string.py", 1);
    o.python = "/nonexistent/python3";
    expect_one_line_error([&] { reward::make_python_scorer(o); },
                          {"custom_reward_function.python", "/nonexistent/python3"});
  }
  {
    auto o = options(dir / "absent.py", 1);
    expect_one_line_error([&] { reward::make_python_scorer(o); }, {"custom_reward_function.path", "absent.py"});
  }
}

TEST(RewardPython, AWorkerThatCrashesOnceIsRestartedOneThatKeepsCrashingStopsTheRun) {
  TempDir dir;
  const fs::path file = dir / "crash.py";
  const std::string marker = nlohmann::json((dir / "crashed-once").string()).dump();
  write_text(file,
             "import os\n"
             "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
             "    if solution_str == 'once' and not os.path.exists(" + marker + "):\n"
             "        open(" + marker + ", 'w').close()\n"
             "        os._exit(3)\n"
             "    if solution_str == 'always':\n"
             "        os.abort()\n"
             "    return 1.5\n");
  Owned q;
  for (int i = 0; i < 8; ++i) q.add("any", i == 5 ? "once" : "fine", "");
  auto scorer = reward::make_python_scorer(options(file, 2));
  const auto r = scorer->score(q.requests());
  for (const auto& s : r.results) EXPECT_EQ(s.score, 1.5);
  EXPECT_TRUE(fs::exists(dir / "crashed-once"));
  Owned bad;
  bad.add("math", "fine", "");
  bad.add("math", "always", "");
  expect_one_line_error([&] { scorer->score(bad.requests()); },
                        {"crash.py:compute_score", "killed by signal 6", "2 times", "response 1", "data_source 'math'"});
  expect_one_line_error([&] { scorer->score(q.requests()); }, {"stopped after an earlier error"});
}

}  // namespace
}  // namespace rpg::test
