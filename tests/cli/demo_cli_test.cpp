// `rpg demo --quick`: every stage of the demo runs through the real code path and leaves
// its outputs in one run directory.
#include <gtest/gtest.h>

#include <map>
#include <sstream>

#include <nlohmann/json.hpp>

#include "rpg/core/io.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

TEST(DemoCli, QuickRunProducesEveryStage) {
  test::TempDir dir;
  const fs::path out = dir / "demo";
  auto r = test::run_process({test::rpg_binary().string(), "demo", "--from-scratch", "--quick", "--no-progress", "--out", out.string(),
                              "--recipes", (test::source_dir() / "recipes").string()},
                             {"OMP_NUM_THREADS=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("held-out accuracy"), std::string::npos) << r.out;
  for (const char* f : {"data/train.parquet", "data/test.parquet", "data/train_sft.jsonl", "tokenizer/tokenizer.json",
                        "model_init/model.safetensors", "sft/model/model.safetensors", "sft/metrics.jsonl",
                        "rl/metrics.jsonl", "rl/report.html", "rl/global_step_2/actor/model.safetensors",
                        "summary.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  // The imperfect demonstrations: every training problem twice; about half the pairs end in
  // an answer 1 or 2 away from the chain's last value, the chain itself untouched.
  std::istringstream clean(read_file(out / "data/train_sft.jsonl")), noisy(read_file(out / "data/train_sft_imperfect.jsonl"));
  std::map<std::string, std::string> right;
  for (std::string line; std::getline(clean, line);) {
    auto j = nlohmann::json::parse(line);
    right[j["prompt"]] = j["response"];
  }
  size_t pairs = 0, wrong = 0;
  for (std::string line; std::getline(noisy, line); ++pairs) {
    auto j = nlohmann::json::parse(line);
    const std::string response = j["response"], good = right.at(j["prompt"]);
    const size_t cut = good.rfind('\n') + 1;
    ASSERT_EQ(response.substr(0, cut), good.substr(0, cut)) << "the worked chain is unchanged";
    const long have = std::stol(response.substr(cut + 8)), want = std::stol(good.substr(cut + 8));
    if (have == want) continue;
    ++wrong;
    EXPECT_TRUE(std::labs(have - want) == 1 || std::labs(have - want) == 2) << response;
    EXPECT_GE(have, 0) << response;
  }
  EXPECT_EQ(pairs, 2 * right.size());
  EXPECT_GT(wrong, pairs * 3 / 10);
  EXPECT_LT(wrong, pairs * 7 / 10);
  auto s = nlohmann::json::parse(read_file(out / "summary.json"));
  for (const char* k : {"sft_accuracy", "rl_accuracy", "improvement_points", "wall_seconds"})
    EXPECT_TRUE(s.contains(k) && s[k].is_number()) << k;
  EXPECT_NE(read_file(out / "rl/report.html").find("<svg"), std::string::npos);
}

// The start line names libtorch's kernel family and the thread count (exact numbers depend on
// them), and --sft-only stops after the warm start: the SFT model and its validation checks,
// no test-split evaluation and no RL (the mode for tuning SFT on the validation split only).
TEST(DemoCli, SftOnlyStopsAfterTheWarmStartAndTheStartLineNamesKernelsAndThreads) {
  test::TempDir dir;
  const fs::path out = dir / "demo";
  auto r = test::run_process({test::rpg_binary().string(), "demo", "--quick", "--sft-only", "--no-progress", "--out",
                              out.string(), "--recipes", (test::source_dir() / "recipes").string()},
                             {"OMP_NUM_THREADS=1", "ATEN_CPU_CAPABILITY=default"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("demo: CPU kernels DEFAULT, 1 thread, seed 0"), std::string::npos) << r.err;
  // --quick: 4 SFT steps, checks at 2 and 4 that an untrained model never passes.
  EXPECT_NE(r.out.find("SFT: 4 steps"), std::string::npos) << r.out;
  EXPECT_NE(r.err.find("SFT step 2: validation"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("SFT step 4: validation"), std::string::npos) << r.err;
  EXPECT_TRUE(fs::exists(out / "sft/model/model.safetensors"));
  EXPECT_EQ(r.err.find("test split"), std::string::npos) << "no test-split evaluation: " << r.err;
  for (const char* f : {"rl", "summary.json"}) EXPECT_FALSE(fs::exists(out / f)) << f;
}

// --compare: every method's recipe runs from the same warm start per seed, and the table
// lists each method with Start / Last / Best taken from that run's own metrics.jsonl.
TEST(DemoCli, QuickCompareRunsEveryMethodAndWritesTheTable) {
  test::TempDir dir;
  const fs::path out = dir / "demo", results = dir / "results.md";
  auto r = test::run_process({test::rpg_binary().string(), "demo", "--quick", "--compare", "--seeds", "4,5",
                              "--no-progress", "--out", out.string(), "--results", results.string(), "--recipes",
                              (test::source_dir() / "recipes").string()},
                             {"OMP_NUM_THREADS=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const std::string md = read_file(results), svg = read_file(dir / "results.svg");
  const std::vector<std::pair<std::string, std::string>> methods = {
      {"GRPO", "grpo"}, {"DAPO", "dapo"}, {"REINFORCE++", "rfpp"}, {"RPG-UFKL", "rpg_ufkl"}, {"RPG-URKL", "rpg_urkl"},
      {"RPG-REINFORCE-UFKL", "rpg_reinforce_ufkl_clip_0.2_0.28"},
      {"RPG-REINFORCE-URKL", "rpg_reinforce_urkl_clip_0.2_0.28"}};
  for (const auto& [name, recipe] : methods) {
    EXPECT_NE(md.find("| " + name + " | "), std::string::npos) << name;
    EXPECT_NE(svg.find("<title>" + name + "</title>"), std::string::npos) << name;
    for (const char* seed : {"seed_4", "seed_5"}) {
      const fs::path run = out / "compare" / seed / recipe;
      // The run used its recipe's algorithm (policy loss as the recipe file says).
      const std::string cfg = read_file(run / "config.yaml"), recipe_text = read_file(test::source_dir() / "recipes" / (recipe + ".yaml"));
      const auto loss_line = [](const std::string& text) {
        const auto at = text.find("policy_loss:");
        return text.substr(at, text.find('\n', at) - at);
      };
      EXPECT_EQ(loss_line(cfg), loss_line(recipe_text)) << run;
      EXPECT_NE(read_file(run / "metrics.jsonl").find("val-core/math_dapo/acc/mean@1"), std::string::npos) << run;
    }
  }
  EXPECT_NE(md.find("rpg demo --compare --seeds 4,5"), std::string::npos) << md;
  // Per seed, the report's comparison page of the seven runs: legend and Table 3 rows.
  for (const char* seed : {"seed_4", "seed_5"}) {
    const std::string page = read_file(out / "compare" / seed / "compare.html");
    for (const auto& [name, recipe] : methods) {
      EXPECT_NE(page.find("<li data-run=\"" + name + "\">"), std::string::npos) << seed << " " << name;
      EXPECT_NE(page.find("<tr><td>" + name + "</td><td data-run="), std::string::npos) << seed << " " << name;
    }
  }
}

TEST(DemoCli, CompareRejectsBadSeedList) {
  auto r = test::run_process({test::rpg_binary().string(), "demo", "--compare", "--seeds", "1,x"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("rpg: error: demo: --seeds"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace rpg
