// `rpg data prepare` / `rpg data show` as a user runs them: exit codes, files read back by
// pyarrow, one-line errors naming the file and column.
#include <gtest/gtest.h>

#include "row_json.h"
#include "rpg/core/io.h"
#include "test_util.h"

namespace rpg::test {
namespace {

const std::string kBefore =
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n";
const std::string kAfter = "\n\nRemember to put your answer on its own line after \"Answer:\".";

nlohmann::json dump(const std::filesystem::path& file) {
  TempDir dir;
  run_oracle("data_parquet.py", {"dump", file.string(), (dir / "out.json").string()});
  return nlohmann::json::parse(read_file(dir / "out.json"));
}

ProcessResult rpg(std::vector<std::string> args) {
  args.insert(args.begin(), rpg_binary().string());
  return run_process(args);
}

TEST(DataCli, PrepareJsonlWithRepeats) {
  TempDir dir;
  write_text(dir / "in.jsonl", "{\"problem\": \"Find x.\", \"answer\": \"5\"}\n{\"problem\": \"Find y.\", \"answer\": 7}\n");
  auto r = rpg({"data", "prepare", (dir / "in.jsonl").string(), (dir / "out.parquet").string(), "--data-source",
                "aime2025", "--repeat", "4"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = dump(dir / "out.parquet");
  ASSERT_EQ(j["num_rows"], 8);
  for (int i = 0; i < 8; ++i) {
    const auto& row = j["rows"][i];
    std::string problem = i < 4 ? "Find x." : "Find y.";
    EXPECT_EQ(row["data_source"], "aime2025");
    EXPECT_EQ(row["prompt"], nlohmann::json::parse(nlohmann::json::array({{{"content", kBefore + problem + kAfter}, {"role", "user"}}}).dump()));
    EXPECT_EQ(row["ability"], "MATH");
    EXPECT_EQ(row["reward_model"]["ground_truth"], i < 4 ? "5" : "7");
    EXPECT_EQ(row["reward_model"]["style"], "rule-lighteval/MATH_v2");
    EXPECT_EQ(row["extra_info"]["index"], i % 4);
    EXPECT_EQ(row["extra_info"]["raw_problem"], problem);
    EXPECT_TRUE(row["extra_info"]["split"].is_null());
  }
}

TEST(DataCli, PrepareCsvWithCustomColumns) {
  TempDir dir;
  write_text(dir / "in.csv", "question,solution\n\"What is 2,000+1?\",\"2,001\"\n");
  auto r = rpg({"data", "prepare", (dir / "in.csv").string(), (dir / "out.parquet").string(), "--problem-key",
                "question", "--answer-key", "solution", "--split", "test"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = dump(dir / "out.parquet");
  ASSERT_EQ(j["num_rows"], 1);
  EXPECT_EQ(j["rows"][0]["data_source"], "math_dapo");
  EXPECT_EQ(j["rows"][0]["reward_model"]["ground_truth"], "2,001");
  EXPECT_EQ(j["rows"][0]["extra_info"]["split"], "test");
  EXPECT_EQ(j["rows"][0]["extra_info"]["raw_problem"], "What is 2,000+1?");
}

TEST(DataCli, PrepareErrorsAreOneLineNamingTheProblem) {
  TempDir dir;
  auto missing = rpg({"data", "prepare", (dir / "nope.jsonl").string(), (dir / "o.parquet").string()});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_EQ(missing.err.rfind("rpg: error: ", 0), 0u) << missing.err;
  EXPECT_NE(missing.err.find("nope.jsonl"), std::string::npos) << missing.err;
  EXPECT_EQ(std::count(missing.err.begin(), missing.err.end(), '\n'), 1);

  write_text(dir / "in.csv", "q,a\nx,1\n");
  auto column = rpg({"data", "prepare", (dir / "in.csv").string(), (dir / "o.parquet").string()});
  EXPECT_EQ(column.exit_code, 1);
  EXPECT_NE(column.err.find("in.csv: no column 'problem'"), std::string::npos) << column.err;
  EXPECT_FALSE(std::filesystem::exists(dir / "o.parquet"));

  auto repeat = rpg({"data", "prepare", (dir / "in.csv").string(), (dir / "o.parquet").string(), "--repeat", "0"});
  EXPECT_EQ(repeat.exit_code, 2);
  EXPECT_NE(repeat.err.find("--repeat"), std::string::npos) << repeat.err;
  auto usage = rpg({"data", "prepare", (dir / "in.csv").string()});
  EXPECT_EQ(usage.exit_code, 2);
  EXPECT_NE(usage.err.find("OUTPUT"), std::string::npos) << usage.err;
}

TEST(DataCli, ShowPrintsSchemaRowCountAndFirstRows) {
  auto r = rpg({"data", "show", (data_dir() / "aime-2024.parquet").string(), "--rows", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("rows: 960"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("prompt: list<element: struct<content: string, role: string>>"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("extra_info: struct<index: int64, raw_problem: string, split: null>"), std::string::npos);
  EXPECT_NE(r.out.find("[0] {\"data_source\":\"math_dapo\""), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\"ground_truth\":\"540\""), std::string::npos) << r.out;  // row 0 per pyarrow
  EXPECT_NE(r.out.find("[1] "), std::string::npos);
  EXPECT_EQ(r.out.find("[2] "), std::string::npos);
}

TEST(DataCli, ShowOfAMistypedFileNamesTheColumn) {
  TempDir dir;
  auto path = dir / "bad.parquet";
  run_oracle("data_parquet.py", {"bad", path.string(), "index_string"});
  auto r = rpg({"data", "show", path.string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("rpg: error: " + path.string() + ": column 'extra_info.index' has type string, expected int64"),
            std::string::npos)
      << r.err;
  auto none = rpg({"data", "show", (dir / "none.parquet").string()});
  EXPECT_EQ(none.exit_code, 1);
  EXPECT_NE(none.err.find("none.parquet"), std::string::npos);
}

}  // namespace
}  // namespace rpg::test
