#include "rpg/core/metrics.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "rpg/core/io.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

std::vector<nlohmann::json> read_lines(const std::string& text) {
  std::vector<nlohmann::json> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(Metrics, Crc32cKnownAnswer) {
  // The standard check value of CRC-32C (RFC 3720, B.4): "123456789" -> 0xE3069283.
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
}

TEST(Metrics, TensorBoardReadsOurEventFiles) {
  test::TempDir dir;
  fs::path file;
  {
    TensorBoardWriter tb(dir.path());
    file = tb.path();
    for (int step = 1; step <= 5; ++step) {
      tb.add_scalar("actor/pg_loss", 0.25 * step, step);
      tb.add_scalar("critic/score/mean", -1.0 + step, step);
    }
    tb.flush(true);
  }
  auto lines = read_lines(test::run_oracle("core_tensorboard.py", {file.string()}).out);
  ASSERT_EQ(lines.size(), 1u + 10u + 1u);
  EXPECT_EQ(lines.front()["file_version"], "brain.Event:2");
  EXPECT_EQ(lines.back()["records"], 11);  // every record passed tensorboard's CRC checks
  for (int step = 1; step <= 5; ++step) {
    const auto& a = lines[static_cast<size_t>(2 * step - 1)];
    const auto& b = lines[static_cast<size_t>(2 * step)];
    EXPECT_EQ(a["tag"], "actor/pg_loss");
    EXPECT_EQ(a["step"], step);
    EXPECT_DOUBLE_EQ(a["value"].get<double>(), 0.25 * step);
    EXPECT_EQ(b["tag"], "critic/score/mean");
    EXPECT_DOUBLE_EQ(b["value"].get<double>(), -1.0 + step);
  }
}

TEST(Metrics, JsonlOneLinePerStepAndResumeDropsLaterSteps) {
  test::TempDir dir;
  {
    MetricsLogger log(dir.path(), /*tensorboard=*/false);
    for (int step = 1; step <= 4; ++step) log.log(step, {{"loss", step * 1.5}, {"nan_metric", std::nan("")}});
  }
  // A crash mid-write leaves a torn last line.
  {
    std::string text = read_file(dir / "metrics.jsonl");
    write_file_atomic(dir / "metrics.jsonl", text + "{\"step\": 5, \"lo");
  }
  {
    MetricsLogger log(dir.path(), false, /*resume_step=*/3);
    log.log(3, {{"loss", 30.0}});
  }
  auto lines = read_lines(read_file(dir / "metrics.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[0]["step"], 1);
  EXPECT_EQ(lines[1]["step"], 2);
  EXPECT_EQ(lines[2]["step"], 3);
  EXPECT_DOUBLE_EQ(lines[2]["loss"].get<double>(), 30.0);
  EXPECT_TRUE(lines[0]["nan_metric"].is_null());
}

}  // namespace
}  // namespace rpg
