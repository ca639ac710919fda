// Bring-your-own reward end to end (issue 37): `rpg train` with custom_reward_function equals
// the built-in rule where both score alike (the function is verl's own math_dapo from the
// venv), uses the function where they differ (its extra keys become reward/extra/* metrics),
// and a broken function stops the run before anything is written; `rpg eval --reward-fn`
// scores as the function called directly in Python (tests/oracles/reward_custom_direct.py).
#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <optional>

#include "reward_server.h"
#include "rpg/core/io.h"
#include "run_fixture.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

class RewardCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixture_ = new fs::path(test::oracle_output_dir("tiny_chat_model.py"));
    shared_ = new test::TempDir();
    data_ = new std::string(test::prepare_prompts(shared_->path()));
  }
  static void TearDownTestSuite() {
    delete shared_;
    delete fixture_;
    delete data_;
  }
  test::ProcessResult train(const fs::path& run, const std::vector<std::string>& more) {
    auto argv = test::tiny_train_argv(*fixture_, *data_, run, 2, 2);
    argv.push_back("custom_reward_function.python=" + test::python().string());
    argv.insert(argv.end(), more.begin(), more.end());
    return test::run_process(argv, {"OMP_NUM_THREADS=1"});
  }
  static std::string reward_file(const std::string& name, const std::string& body) {
    const fs::path p = shared_->path() / name;
    test::write_text(p, body);
    return p.string();
  }
  static fs::path* fixture_;
  static test::TempDir* shared_;
  static std::string* data_;
};

fs::path* RewardCli::fixture_ = nullptr;
test::TempDir* RewardCli::shared_ = nullptr;
std::string* RewardCli::data_ = nullptr;

// Metrics without the reward scorer's own keys (reward/*) and wall-clock ones.
std::vector<std::map<std::string, double>> learning_metrics(const fs::path& run) {
  auto steps = test::step_metrics(run / "metrics.jsonl");
  for (auto& m : steps)
    std::erase_if(m, [](const auto& kv) { return kv.first.rfind("reward/", 0) == 0; });
  return steps;
}

TEST_F(RewardCli, VerlsMathDapoAsACustomFunctionTrainsExactlyAsTheBuiltInRule) {
  const std::string file = reward_file("verl_dapo.py",
                                       "from verl.utils.reward_score import math_dapo\n"
                                       "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                       "    assert data_source == 'math_dapo' and extra_info['index'] == 0\n"
                                       "    return math_dapo.compute_score(solution_str, ground_truth)\n");
  const fs::path builtin = shared_->path() / "builtin", custom = shared_->path() / "custom";
  auto a = train(builtin, {});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  auto b = train(custom, {"custom_reward_function.path=" + file, "reward_model.num_workers=2"});
  ASSERT_EQ(b.exit_code, 0) << b.err;
  const auto ma = learning_metrics(builtin), mb = learning_metrics(custom);
  ASSERT_EQ(ma.size(), 2u);
  EXPECT_EQ(ma, mb);
  EXPECT_EQ(test::step_metrics(custom / "metrics.jsonl").back().at("reward/timeouts"), 0.0);
  EXPECT_EQ(read_file(builtin / "global_step_2" / "actor" / "model.safetensors"),
            read_file(custom / "global_step_2" / "actor" / "model.safetensors"))
      << "the same scores must train the same weights";
}

TEST_F(RewardCli, ACustomFunctionThatScoresDifferentlyIsWhatTrains) {
  const std::string file = reward_file("by_length.py",
                                       "def compute_score(data_source, solution_str, ground_truth, extra_info=None, "
                                       "scale=1.0):\n"
                                       "    return {'score': scale * (len(solution_str) % 3 - 1), 'chars': len(solution_str)}\n");
  const fs::path run = shared_->path() / "by_length";
  auto r = train(run, {"custom_reward_function.path=" + file, "+custom_reward_function.reward_kwargs.scale=0.5",
                       "reward_model.num_workers=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto steps = test::step_metrics(run / "metrics.jsonl");
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& m : steps) {
    ASSERT_TRUE(m.count("reward/extra/chars/mean")) << "a dict result's other keys are logged";
    EXPECT_GT(m.at("reward/extra/chars/mean"), 0.0);
    const double score = m.at("critic/score/mean");
    EXPECT_LE(std::abs(score), 0.5);
    EXPECT_NE(score, -1.0) << "the built-in rule would score every response -1";
  }
  const std::string config = read_file(run / "config.yaml");
  EXPECT_NE(config.find("by_length.py"), std::string::npos);
  EXPECT_NE(config.find("scale: 0.5"), std::string::npos) << config;
}

TEST_F(RewardCli, AFunctionThatHangsOnSomeResponsesCostsTheirTimeoutsNotTheRun) {
  const fs::path marks = shared_->path() / "hang_marks";
  fs::create_directories(marks);
  const std::string dir = nlohmann::json(marks.string()).dump();
  const std::string file = reward_file("hangs.py",
                                       "import os, time, uuid\n"
                                       "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
                                       "    open(os.path.join(" + dir + ", f'pid-{os.getpid()}'), 'w').close()\n"
                                       "    if len(solution_str) % 2:\n"
                                       "        open(os.path.join(" + dir + ", f'hang-{uuid.uuid4()}'), 'w').close()\n"
                                       "        while True: time.sleep(60)\n"
                                       "    return 1.0\n");
  const fs::path run = shared_->path() / "hangs";
  auto r = train(run, {"custom_reward_function.path=" + file, "reward_model.num_workers=2",
                       "reward_model.timeout_s=1", "reward_model.timeout_score=-1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  double timeouts = 0;
  for (const auto& m : test::step_metrics(run / "metrics.jsonl")) timeouts += m.at("reward/timeouts");
  size_t hangs = 0, pids = 0;
  for (const auto& e : fs::directory_iterator(marks)) {
    const std::string name = e.path().filename().string();
    if (name.starts_with("hang-")) ++hangs;
    if (name.starts_with("pid-")) {
      ++pids;
      EXPECT_NE(::kill(std::stoi(name.substr(4)), 0), 0) << name << ": a reward worker outlived rpg train";
    }
  }
  EXPECT_GT(hangs, 0u) << "the seeded run must produce odd-length responses, or this proves nothing";
  EXPECT_EQ(timeouts, static_cast<double>(hangs)) << "every hung call is one timeout, and nothing else is";
  EXPECT_GE(pids, 2u);
}

TEST_F(RewardCli, ABrokenFunctionStopsTheRunBeforeAnythingIsWritten) {
  struct Case {
    std::string name, body, expect;
  };
  const std::vector<Case> cases{
      {"syntax.py", "def compute_score(:\n", "SyntaxError"},
      {"missing.py", "def score(*a):\n    return 1\n", "has no function 'compute_score'"},
      {"raises.py", "def compute_score(*a, **k):\n    raise KeyError('gt')\n", "raised KeyError: 'gt'"},
      {"string.py", "def compute_score(*a, **k):\n    return 'yes'\n", "returned str ('yes')"},
  };
  for (const auto& c : cases) {
    const std::string file = reward_file(c.name, c.body);
    const fs::path run = shared_->path() / ("broken_" + c.name);
    auto r = train(run, {"custom_reward_function.path=" + file, "reward_model.num_workers=1"});
    EXPECT_EQ(r.exit_code, 1) << c.name << ": " << r.err;
    const auto errors = test::lines_starting(r.err, "rpg: error: ");
    ASSERT_EQ(errors.size(), 1u) << r.err;
    EXPECT_NE(errors[0].find(file), std::string::npos) << errors[0];
    EXPECT_NE(errors[0].find(c.expect), std::string::npos) << errors[0];
    // An import failure is refused before the run directory exists; a failing call (step 1)
    // leaves no checkpoint and no half-written file.
    EXPECT_EQ(test::expect_only_complete_checkpoints(run), 0) << c.name;
    EXPECT_TRUE(test::temporaries(run).empty()) << c.name;
    if (c.name == "syntax.py" || c.name == "missing.py") {
      EXPECT_FALSE(fs::exists(run)) << c.name;
    }
  }
}

TEST_F(RewardCli, TrainingWithARewardServiceLogsItsExtraKeys) {
  std::optional<test::RewardServer> server;
  server.emplace();
  const std::string url = server->url();
  const fs::path run = shared_->path() / "service";
  auto r = train(run, {"reward_model.url=" + url, "reward_model.request_batch_size=3"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto steps = test::step_metrics(run / "metrics.jsonl");
  ASSERT_EQ(steps.size(), 2u);
  for (const auto& m : steps) {
    EXPECT_EQ(m.at("reward/timeouts"), 0.0);
    ASSERT_TRUE(m.count("reward/extra/length/mean")) << "the service's 'length' key is logged";
    EXPECT_GT(m.at("reward/extra/length/mean"), 0.0);
    EXPECT_GE(m.at("critic/score/mean"), 0.0) << "the service scores 0 / 1, the built-in DAPO rule -1 / +1";
  }
  // With the service gone, the run stops naming it after its retries.
  server.reset();
  auto gone = train(shared_->path() / "service_gone", {"reward_model.url=" + url});
  EXPECT_EQ(gone.exit_code, 1) << gone.err;
  const auto errors = test::lines_starting(gone.err, "rpg: error: ");
  ASSERT_EQ(errors.size(), 1u) << gone.err;
  EXPECT_NE(errors[0].find(url), std::string::npos) << errors[0];
}

TEST_F(RewardCli, EvalWithRewardUrlScoresAsTheService) {
  test::RewardServer server;
  std::string responses;
  for (int i = 0; i < 30; ++i)
    responses += nlohmann::json{{"data_source", "any"}, {"ground_truth", std::to_string(i % 4)},
                                {"prompt", "p" + std::to_string(i % 6)}, {"response", " " + std::to_string(i % 3) + " "}}
                     .dump() +
                 "\n";
  const fs::path in = shared_->path() / "url_responses.jsonl", scored = shared_->path() / "url_scored.jsonl";
  test::write_text(in, responses);
  auto r = test::run_process({test::rpg_binary().string(), "eval", "--responses", in.string(), "--reward-url",
                              server.url(), "--scored-output", scored.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  // The service (tests/oracles/reward_http_server.py) scores 1 when the stripped response is
  // the ground truth, and reports it as pred.
  std::istringstream lines(read_file(scored));
  std::string line;
  int n = 0, right = 0;
  for (; std::getline(lines, line); ++n) {
    const auto j = nlohmann::json::parse(line);
    const double want = std::to_string(n % 3) == std::to_string(n % 4) ? 1.0 : 0.0;
    EXPECT_EQ(j["score"].get<double>(), want) << n;
    EXPECT_EQ(j["pred"].get<std::string>(), std::to_string(n % 3)) << n;
    right += want > 0;
  }
  EXPECT_EQ(n, 30);
  EXPECT_GT(right, 0);
}

TEST_F(RewardCli, BadRewardKeysAreOneLineConfigErrors) {
  const fs::path run = shared_->path() / "bad_keys";
  for (const auto& [override_, expect] : std::vector<std::pair<std::string, std::string>>{
           {"reward_model.reward_manager=batch", "reward_model.reward_manager: batch"},
           {"reward_model.reward_manager=naive2", "reward_model.reward_manager: got 'naive2'"},
           {"reward_model.url=ftp://x", "reward_model.url: must start with http://"},
           {"reward_model.timeout_s=0", "reward_model.timeout_s"},
           {"custom_reward_function.path=/nonexistent/r.py", "custom_reward_function.path: /nonexistent/r.py"},
           {"custom_reward_function.reward_kwargs=[1]", "custom_reward_function.reward_kwargs"}}) {
    auto r = train(run, {override_});
    EXPECT_EQ(r.exit_code, 1) << override_;
    const auto errors = test::lines_starting(r.err, "rpg: error: ");
    ASSERT_EQ(errors.size(), 1u) << override_ << ": " << r.err;
    EXPECT_NE(errors[0].find(expect), std::string::npos) << errors[0];
    EXPECT_FALSE(fs::exists(run)) << override_;
  }
}

TEST_F(RewardCli, EvalWithRewardFnScoresAsTheFunctionCalledDirectly) {
  const std::string file = reward_file("contains.py",
                                       "def judge(data_source, solution_str, ground_truth, extra_info=None):\n"
                                       "    return {'score': float(ground_truth in solution_str), 'pred': solution_str[-4:]}\n");
  std::string responses, requests;
  for (int i = 0; i < 40; ++i) {
    const std::string gt = std::to_string(i % 7), text = "the answer is " + std::to_string(i % 5);
    responses += nlohmann::json{{"data_source", "anything"}, {"ground_truth", gt}, {"prompt", "p" + std::to_string(i % 10)},
                                {"response", text}}.dump() + "\n";
    requests += nlohmann::json{{"data_source", "anything"}, {"solution_str", text}, {"ground_truth", gt}}.dump() + "\n";
  }
  test::write_text(shared_->path() / "responses.jsonl", responses);
  test::write_text(shared_->path() / "requests.jsonl", requests);
  const fs::path scored = shared_->path() / "scored.jsonl";
  auto r = test::run_process({test::rpg_binary().string(), "eval", "--responses", (shared_->path() / "responses.jsonl").string(),
                              "--reward-fn", file + ":judge", "--reward-python", test::python().string(),
                              "--reward-workers", "2", "--scored-output", scored.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const auto direct = test::run_oracle("reward_custom_direct.py",
                                       {file, "judge", (shared_->path() / "requests.jsonl").string()});
  ASSERT_EQ(direct.exit_code, 0) << direct.err;
  std::istringstream want(direct.out), got(read_file(scored));
  std::string w, g;
  int n = 0, right = 0;
  while (std::getline(want, w) && std::getline(got, g)) {
    const auto jw = nlohmann::json::parse(w), jg = nlohmann::json::parse(g);
    EXPECT_EQ(jg["score"].get<double>(), jw["score"].get<double>()) << n;
    EXPECT_EQ(jg["pred"].get<std::string>(), jw["pred"].get<std::string>()) << n;
    right += jw["score"].get<double>() > 0;
    ++n;
  }
  EXPECT_EQ(n, 40);
  EXPECT_GT(right, 0);
  EXPECT_LT(right, 40);
  // An unknown data_source is fine for a custom function; a raising one is one line, exit 1.
  const std::string bad = reward_file("raise_eval.py", "def compute_score(*a, **k):\n    1/0\n");
  auto e = test::run_process({test::rpg_binary().string(), "eval", "--responses", (shared_->path() / "responses.jsonl").string(),
                              "--reward-fn", bad, "--reward-python", test::python().string(), "--output",
                              (shared_->path() / "never.json").string()});
  EXPECT_EQ(e.exit_code, 1) << e.err;
  const auto errors = test::lines_starting(e.err, "rpg: error: ");
  ASSERT_EQ(errors.size(), 1u) << e.err;
  EXPECT_NE(errors[0].find("raise_eval.py:compute_score raised ZeroDivisionError: division by zero"), std::string::npos)
      << errors[0];
  EXPECT_FALSE(fs::exists(shared_->path() / "never.json"));
}

}  // namespace
}  // namespace rpg
