// The threaded code, each part driven by 8 threads: batch scoring (reward::score_batch),
// the Python reward pool and the reward service client shared by threads, batch tokenization (Tokenizer::batch_encode), the progress bar and the metrics writer.
// Results must equal the one-thread results. Built twice: as a normal test, and under
// ThreadSanitizer by scripts/tsan.sh (docs/robustness.md), where any data race fails it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "rpg/core/io.h"
#include "rpg/core/metrics.h"
#include "rpg/core/progress.h"
#include "rpg/reward/http_scorer.h"
#include "rpg/reward/python_pool.h"
#include "rpg/reward/registry.h"
#include "reward_server.h"
#include "rpg/tokenizer/tokenizer.h"
#include "test_util.h"
#include "tiny_tokenizer.h"

namespace rpg {
namespace {

constexpr int kThreads = 8;

TEST(Threads, ScoreBatchWith8ThreadsEqualsOneThread) {
  const auto registry = reward::builtin_scorers();
  std::vector<std::string> responses, truths;
  std::vector<reward::ScoreRequest> requests;
  for (int i = 0; i < 800; ++i) {
    responses.push_back("Let me think... " + std::string(static_cast<size_t>(i % 37), 'x') + " Answer: " +
                        std::to_string(i % 13) + (i % 3 ? "" : " \\boxed{" + std::to_string(i % 7) + "}"));
    truths.push_back(std::to_string(i % 11));
  }
  for (int i = 0; i < 800; ++i)
    requests.push_back({i % 2 ? "math_dapo" : "lighteval/MATH", responses[static_cast<size_t>(i)],
                        truths[static_cast<size_t>(i)]});
  const auto one = reward::score_batch(registry, requests, 1);
  const auto many = reward::score_batch(registry, requests, kThreads);
  ASSERT_EQ(one.size(), many.size());
  int correct = 0;
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(one[i].score, many[i].score) << i;
    EXPECT_EQ(one[i].acc, many[i].acc) << i;
    correct += one[i].acc ? 1 : 0;
  }
  EXPECT_GT(correct, 0) << "no request scored right: the batch does not exercise both outcomes";
  EXPECT_LT(correct, 800);
}

// Each thread scores its own batch through one shared scorer; every result must be the
// function's own for that thread's requests.
void score_from_threads(reward::RewardScorer& scorer, const std::function<double(const std::string&)>& expected) {
  std::vector<std::vector<std::string>> texts(kThreads);
  std::vector<std::vector<reward::RewardScores>> got(kThreads);
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; ++t) {
    for (int i = 0; i < 12; ++i) texts[t].push_back(std::string(static_cast<size_t>(t + i), 'a') + "7");
    pool.emplace_back([&, t] {
      std::vector<reward::ScoreRequest> requests;
      for (const auto& s : texts[t]) requests.push_back({"any", s, "7"});
      for (int round = 0; round < 3; ++round) got[t].push_back(scorer.score(requests));
    });
  }
  for (auto& th : pool) th.join();
  for (int t = 0; t < kThreads; ++t)
    for (const auto& r : got[t]) {
      ASSERT_EQ(r.results.size(), texts[t].size());
      for (size_t i = 0; i < texts[t].size(); ++i) EXPECT_EQ(r.results[i].score, expected(texts[t][i])) << t << " " << i;
    }
}

TEST(Threads, PythonRewardPoolSharedBy8Threads) {
  test::TempDir dir;
  test::write_text(dir / "r.py", "def compute_score(ds, s, gt, extra_info=None):\n    return len(s)\n");
  reward::PythonRewardOptions o;
  o.path = (dir / "r.py").string();
  o.python = test::python().string();
  o.num_workers = 3;
  auto scorer = reward::make_python_scorer(o);
  score_from_threads(*scorer, [](const std::string& s) { return static_cast<double>(s.size()); });
}

TEST(Threads, RewardServiceClientSharedBy8Threads) {
  test::RewardServer server;
  reward::HttpRewardOptions o;
  o.url = server.url();
  o.batch_size = 5;
  o.max_concurrency = 3;
  auto scorer = reward::make_http_scorer(o);
  // The test server: 1 when the stripped response equals the ground truth, else 0.
  score_from_threads(*scorer, [](const std::string& s) { return s == "7" ? 1.0 : 0.0; });
}

TEST(Threads, BatchEncodeWith8ThreadsEqualsOneThread) {
  const auto tok = tok::Tokenizer::from_json(test::tiny_tokenizer_json(test::kQwen2Regex, false).dump(), "tiny");
  std::vector<std::string> texts;
  for (int i = 0; i < 2000; ++i)
    texts.push_back("the cat " + std::to_string(i) + " sat on the mat, caf\xc3\xa9 " + std::string(static_cast<size_t>(i % 50), 'a'));
  const auto one = tok.batch_encode(texts, false, 1);
  const auto many = tok.batch_encode(texts, false, kThreads);
  EXPECT_EQ(one, many);
}

TEST(Threads, ProgressBarAdvancedBy8Threads) {
  test::TempDir dir;
  std::FILE* out = std::fopen((dir / "bar.txt").c_str(), "w");
  ASSERT_NE(out, nullptr);
  {
    ProgressBar bar("work", kThreads * 1000, "it", 0.0, out);
    std::vector<std::thread> pool;
    for (int t = 0; t < kThreads; ++t)
      pool.emplace_back([&, t] {
        for (int i = 0; i < 1000; ++i) bar.advance(1, "thread=" + std::to_string(t));
      });
    for (auto& th : pool) th.join();
    EXPECT_EQ(bar.done(), kThreads * 1000);
    bar.finish();
  }
  std::fclose(out);
  const std::string text = read_file(dir / "bar.txt");
  EXPECT_NE(text.find("work 100% |####################| 8000/8000"), std::string::npos) << text.substr(text.size() - 200);
}

TEST(Threads, MetricsLoggerWrittenBy8ThreadsHasWholeLines) {
  test::TempDir dir;
  {
    MetricsLogger logger(dir.path(), /*tensorboard=*/true);
    std::vector<std::thread> pool;
    for (int t = 0; t < kThreads; ++t)
      pool.emplace_back([&, t] {
        for (int i = 0; i < 100; ++i)
          logger.log(t * 100 + i + 1, {{"thread", t}, {"i", i}, {"long/name/of/a/metric", 1.0 / (i + 1)}});
      });
    for (auto& th : pool) th.join();
    logger.flush(true);
  }
  std::istringstream in(read_file(dir / "metrics.jsonl"));
  std::string line;
  std::vector<bool> seen(kThreads * 100 + 1, false);
  int lines = 0;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, false);
    ASSERT_TRUE(j.is_object()) << "torn line: " << line;
    const int step = j["step"].get<int>();
    EXPECT_EQ(step, j["thread"].get<int>() * 100 + j["i"].get<int>() + 1);
    seen[static_cast<size_t>(step)] = true;
    ++lines;
  }
  EXPECT_EQ(lines, kThreads * 100);
  EXPECT_EQ(std::count(seen.begin() + 1, seen.end(), true), kThreads * 100);
}

}  // namespace
}  // namespace rpg
