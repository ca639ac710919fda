#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/jsonl.h"
#include "test_util.h"

namespace rpg {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const FormatError& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Jsonl, ReadsObjectsSkipsBlankLinesAndNumbersLinesFromOne) {
  std::vector<size_t> numbers;
  std::vector<int> values;
  jsonl::parse("{\"a\": 1}\n\n  \n{\"a\": 2}\r\n{\"a\": 3}", "x.jsonl", [&](size_t n, nlohmann::json& j) {
    numbers.push_back(n);
    values.push_back(j["a"].get<int>());
  });
  EXPECT_EQ(numbers, (std::vector<size_t>{1, 4, 5}));
  EXPECT_EQ(values, (std::vector<int>{1, 2, 3}));
}

TEST(Jsonl, TornLastLineIsSkippedOnlyWhenAllowedAndOnlyWhenLast) {
  const std::string torn = "{\"step\": 1}\n{\"step\": 2}\n{\"ste";
  size_t n = 0;
  jsonl::parse(torn, "m.jsonl", [&](size_t, nlohmann::json&) { ++n; });
  EXPECT_EQ(n, 2u);
  EXPECT_EQ(error_of([&] { jsonl::parse(torn, "m.jsonl", [](size_t, nlohmann::json&) {}, {.allow_torn_last_line = false}); }),
            "m.jsonl:3: not valid JSON");
  EXPECT_EQ(error_of([&] { jsonl::parse("{\"a\":1}\n{bad\n{\"a\":2}\n", "m.jsonl", [](size_t, nlohmann::json&) {}); }),
            "m.jsonl:2: not valid JSON");
  EXPECT_EQ(error_of([&] { jsonl::parse("[1, 2]\n", "m.jsonl", [](size_t, nlohmann::json&) {}, {.allow_torn_last_line = false}); }),
            "m.jsonl:1: expected a JSON object, got array");
}

TEST(Jsonl, KeepStepsRewritesAtomicallyAndDropsTornAndStepless) {
  test::TempDir dir;
  const auto path = dir / "metrics.jsonl";
  write_file_atomic(path, "{\"step\": 1, \"x\": 0.5}\n{\"note\": 1}\n{\"step\": 2}\n{\"step\": 3}\n{\"step\": 4, \"x");
  jsonl::keep_steps(path, [](int64_t s) { return s <= 2; });
  EXPECT_EQ(read_file(path), "{\"step\": 1, \"x\": 0.5}\n{\"step\": 2}\n");
  jsonl::keep_steps(dir / "missing.jsonl", [](int64_t) { return true; });
  EXPECT_FALSE(std::filesystem::exists(dir / "missing.jsonl"));
}

}  // namespace
}  // namespace rpg
