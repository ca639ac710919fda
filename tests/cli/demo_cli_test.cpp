// `rpg demo --quick`: every stage of the demo runs through the real code path and leaves
// its outputs in one run directory.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "rpg/core/io.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

TEST(DemoCli, QuickRunProducesEveryStage) {
  test::TempDir dir;
  const fs::path out = dir / "demo";
  auto r = test::run_process({test::rpg_binary().string(), "demo", "--quick", "--no-progress", "--out", out.string()},
                             {"OMP_NUM_THREADS=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("held-out accuracy"), std::string::npos) << r.out;
  for (const char* f : {"data/train.parquet", "data/test.parquet", "data/train_sft.jsonl", "tokenizer/tokenizer.json",
                        "model_init/model.safetensors", "sft/model/model.safetensors", "sft/metrics.jsonl",
                        "rl/metrics.jsonl", "rl/report.html", "rl/global_step_2/actor/model.safetensors",
                        "summary.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f;
  auto s = nlohmann::json::parse(read_file(out / "summary.json"));
  for (const char* k : {"sft_accuracy", "rl_accuracy", "improvement_points", "wall_seconds"})
    EXPECT_TRUE(s.contains(k) && s[k].is_number()) << k;
  EXPECT_NE(read_file(out / "rl/report.html").find("<svg"), std::string::npos);
}

}  // namespace
}  // namespace rpg
