// JSONL / CSV records -> rows in the paper's schema. The prompt template is checked
// against the authors' own files: preparing their raw problems reproduces their rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "row_json.h"
#include "rpg/core/error.h"
#include "rpg/data/dataset.h"
#include "rpg/data/prepare.h"
#include "test_util.h"

namespace rpg::test {
namespace {

// The AMC file numbers repeats 0..31 like `--repeat 32`; the AIME file puts the problem
// number in extra_info.index, so there the index is left out of the comparison.
TEST(DataPrepare, ReproducesThePaperFilesFromTheirRawProblems) {
  for (auto [name, source] : {std::pair{"aime-2024.parquet", "math_dapo"}, std::pair{"amc-23.parquet", "amc_23"}}) {
    const bool compare_index = std::string(name) == "amc-23.parquet";
    auto real = data::read_parquet(data_dir() / name);
    std::map<std::string, std::string> answers;
    for (const auto& r : real) answers[r.extra_info.raw_problem] = r.reward_model.ground_truth;
    std::vector<data::ProblemRecord> records;
    for (const auto& [p, a] : answers) records.push_back({p, a});
    data::PrepareOptions opt;
    opt.data_source = source;
    opt.repeat = 32;
    auto ours = data::prepare_rows(records, opt);
    auto key = [&](data::Row r) {
      if (!compare_index) r.extra_info.index = 0;
      return row_to_json(r).dump();
    };
    std::vector<std::string> a, b;
    for (const auto& r : real) a.push_back(key(r));
    for (const auto& r : ours) b.push_back(key(r));
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    EXPECT_TRUE(a == b) << name << ": prepared rows differ from the file's";
  }
}

TEST(DataPrepare, RepeatsAreProblemMajorWithIndices) {
  data::PrepareOptions opt;
  opt.data_source = "aime2025";
  opt.split = "test";
  opt.repeat = 3;
  auto rows = data::prepare_rows({{"p0", "1"}, {"p1", "2"}}, opt);
  ASSERT_EQ(rows.size(), 6u);
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(rows[i].extra_info.index, static_cast<int64_t>(i % 3));
    EXPECT_EQ(rows[i].extra_info.raw_problem, i < 3 ? "p0" : "p1");
    EXPECT_EQ(rows[i].reward_model.ground_truth, i < 3 ? "1" : "2");
    EXPECT_EQ(rows[i].data_source, "aime2025");
    EXPECT_EQ(rows[i].extra_info.split, std::optional<std::string>("test"));
  }
  opt.repeat = 0;
  EXPECT_THROW(data::prepare_rows({{"p", "a"}}, opt), ValueError);
  opt.repeat = 1;
  opt.data_source = "";
  EXPECT_THROW(data::prepare_rows({{"p", "a"}}, opt), ValueError);
}

TEST(DataPrepare, ReadsJsonlWithConfigurableKeysAndNumericAnswers) {
  TempDir dir;
  write_text(dir / "in.jsonl",
             "{\"question\": \"What is 1+1?\\nExplain.\", \"solution\": 2, \"other\": [1]}\n\n"
             "{\"question\": \"Half?\", \"solution\": \"\\\\frac{1}{2}\"}\r\n");
  auto recs = data::read_records(dir / "in.jsonl", {.problem = "question", .answer = "solution"});
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_EQ(recs[0].problem, "What is 1+1?\nExplain.");
  EXPECT_EQ(recs[0].answer, "2");
  EXPECT_EQ(recs[1].answer, "\\frac{1}{2}");
  try {
    data::read_records(dir / "in.jsonl");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("in.jsonl:1: missing key 'problem'"), std::string::npos) << e.what();
  }
  write_text(dir / "bad.jsonl", "{\"problem\": \"x\", \"answer\": \"1\"}\n{oops\n");
  try {
    data::read_records(dir / "bad.jsonl");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("bad.jsonl:2: not valid JSON"), std::string::npos) << e.what();
  }
}

TEST(DataPrepare, ReadsRfc4180Csv) {
  TempDir dir;
  write_text(dir / "in.csv",
             "\xEF\xBB\xBFid,problem,answer\r\n"
             "1,\"Multi-line\nproblem, with \"\"quotes\"\"\",42\r\n"
             "2,plain,\"1,000\"\n"
             "3,,\n");
  auto recs = data::read_records(dir / "in.csv");
  ASSERT_EQ(recs.size(), 3u);
  EXPECT_EQ(recs[0].problem, "Multi-line\nproblem, with \"quotes\"");
  EXPECT_EQ(recs[0].answer, "42");
  EXPECT_EQ(recs[1].answer, "1,000");
  EXPECT_EQ(recs[2].problem, "");
  try {
    data::read_records(dir / "in.csv", {.problem = "question"});
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("no column 'question'"), std::string::npos) << e.what();
  }
  write_text(dir / "ragged.csv", "problem,answer\nx\n");
  EXPECT_THROW(data::read_records(dir / "ragged.csv"), FormatError);
  write_text(dir / "open.csv", "problem,answer\n\"x,1\n");
  EXPECT_THROW(data::read_records(dir / "open.csv"), FormatError);
  EXPECT_THROW(data::read_records(dir / "in.txt"), UsageError);
}

}  // namespace
}  // namespace rpg::test
