// Parquet I/O of the paper's schema against pyarrow (live): our files read by pyarrow with
// the right schema and values, pyarrow's files (several layouts) read by us, the two real
// data files, and the errors for missing / mistyped columns.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "row_json.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/data/dataset.h"
#include "rpg/data/prepare.h"
#include "test_util.h"

namespace rpg::test {
namespace {

namespace fs = std::filesystem;
using data::Row;

std::vector<Row> sample_rows() {
  std::vector<Row> rows;
  for (int i = 0; i < 10; ++i) {
    Row r;
    r.data_source = i % 3 == 0 ? "math_dapo" : i % 3 == 1 ? "aime2025" : "amc_23";
    r.prompt = {{data::apply_prompt_template("Problem " + std::to_string(i) + ": find $x$ with \"quotes\" ∑ 😀"), "user"}};
    if (i == 4) r.prompt.insert(r.prompt.begin(), {"You are a helpful assistant.", "system"});
    if (i == 5) r.prompt.clear();  // an empty message list is representable
    r.ability = i == 7 ? "" : "MATH";
    r.reward_model = {i == 2 ? "" : "\\frac{" + std::to_string(i) + "}{7}", i == 8 ? "other" : "rule-lighteval/MATH_v2"};
    r.extra_info.index = i == 9 ? (int64_t{1} << 40) : i % 4;
    r.extra_info.raw_problem = "line one\nline two " + std::to_string(i);
    if (i % 2) r.extra_info.split = i == 3 ? "" : "test";
    rows.push_back(r);
  }
  return rows;
}

nlohmann::json dump(const fs::path& file) {
  TempDir dir;
  run_oracle("data_parquet.py", {"dump", file.string(), (dir / "out.json").string()});
  return nlohmann::json::parse(read_file(dir / "out.json"));
}

TEST(DataParquet, OurFilesReadByPyarrowWithTheSchemaAndValues) {
  TempDir dir;
  auto rows = sample_rows();
  write_parquet(dir / "out.parquet", rows);
  auto j = dump(dir / "out.parquet");
  const std::map<std::string, std::string> want = {
      {"data_source", "string"},
      {"prompt", "list<element: struct<content: string, role: string>>"},
      {"ability", "string"},
      {"reward_model", "struct<ground_truth: string, style: string>"},
      {"extra_info", "struct<index: int64, raw_problem: string, split: string>"}};
  auto schema = j["schema"].get<std::map<std::string, std::string>>();
  EXPECT_EQ(schema, want);
  ASSERT_EQ(j["num_rows"], rows.size());
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(j["rows"][i], row_to_json(rows[i])) << "row " << i;
  // and back through our reader
  EXPECT_EQ(data::read_parquet(dir / "out.parquet"), rows);
  // no temporary file is left beside the target
  EXPECT_EQ(std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator()), 1);
}

TEST(DataParquet, EmptyDatasetRoundTrips) {
  TempDir dir;
  data::write_parquet(dir / "empty.parquet", {});
  EXPECT_EQ(dump(dir / "empty.parquet")["num_rows"], 0);
  EXPECT_TRUE(data::read_parquet(dir / "empty.parquet").empty());
}

class PyarrowWritten : public ::testing::TestWithParam<std::string> {};

TEST_P(PyarrowWritten, ReadByUs) {
  TempDir dir;
  auto rows = sample_rows();
  nlohmann::json in = nlohmann::json::array();
  for (const auto& r : rows) in.push_back(row_to_json(r));
  write_file_atomic(dir / "in.json", in.dump());
  run_oracle("data_parquet.py", {"write", (dir / "in.json").string(), (dir / "f.parquet").string(), GetParam()});
  auto got = data::read_parquet(dir / "f.parquet");
  if (GetParam() == "null_split")
    for (auto& r : rows) r.extra_info.split.reset();
  ASSERT_EQ(got.size(), rows.size());
  for (size_t i = 0; i < rows.size(); ++i) EXPECT_EQ(row_to_json(got[i]), row_to_json(rows[i])) << "row " << i;
}

INSTANTIATE_TEST_SUITE_P(Layouts, PyarrowWritten,
                         ::testing::Values("plain", "null_split", "large_string", "row_groups", "extra_columns"));

struct RealFile {
  std::string name, data_source;
  size_t rows, problems;
  bool index_is_repeat;
};

void PrintTo(const RealFile& f, std::ostream* os) { *os << f.name; }

class RealData : public ::testing::TestWithParam<RealFile> {};

TEST_P(RealData, LoadsWithTheExpectedRowsSourcesAndRepeats) {
  const auto& p = GetParam();
  auto path = data_dir() / p.name;
  auto rows = data::read_parquet(path);
  ASSERT_EQ(rows.size(), p.rows);
  // Every field equals pyarrow's reading of the same file.
  auto j = dump(path);
  ASSERT_EQ(j["num_rows"], p.rows);
  for (size_t i = 0; i < rows.size(); ++i) {
    auto want = j["rows"][i];
    want.erase("__index_level_0__");
    ASSERT_EQ(row_to_json(rows[i]), want) << "row " << i;
  }
  // 32 rows per problem; one data_source; null split. The two files use extra_info.index
  // differently: AMC 23 numbers the repeats 0..31, the AIME 2024 file numbers the problems
  // (0..29, the same index on all 32 repeats of a problem).
  std::map<std::string, std::multiset<int64_t>> indices;
  for (const auto& r : rows) {
    EXPECT_EQ(r.data_source, p.data_source);
    EXPECT_FALSE(r.extra_info.split.has_value());
    ASSERT_EQ(r.prompt.size(), 1u);
    EXPECT_EQ(r.prompt[0].role, "user");
    EXPECT_EQ(r.prompt[0].content, data::apply_prompt_template(r.extra_info.raw_problem));
    indices[r.extra_info.raw_problem].insert(r.extra_info.index);
  }
  EXPECT_EQ(indices.size(), p.problems);
  std::set<int64_t> problem_ids;
  for (const auto& [problem, idx] : indices) {
    ASSERT_EQ(idx.size(), 32u) << problem;
    if (p.index_is_repeat) {
      std::multiset<int64_t> want;
      for (int64_t k = 0; k < 32; ++k) want.insert(k);
      EXPECT_EQ(idx, want) << problem;
    } else {
      EXPECT_EQ(idx.count(*idx.begin()), 32u) << problem;
      problem_ids.insert(*idx.begin());
    }
  }
  if (!p.index_is_repeat) {
    EXPECT_EQ(problem_ids.size(), p.problems);
    EXPECT_EQ(*problem_ids.begin(), 0);
    EXPECT_EQ(*problem_ids.rbegin(), static_cast<int64_t>(p.problems) - 1);
  }
}

INSTANTIATE_TEST_SUITE_P(PaperData, RealData,
                         ::testing::Values(RealFile{"aime-2024.parquet", "math_dapo", 960, 30, false},
                                           RealFile{"amc-23.parquet", "amc_23", 1280, 40, true}),
                         [](const auto& info) { return info.param.name.substr(0, info.param.name.find('-')); });

struct BadCase {
  std::string name;
  std::vector<std::string> must_contain;
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << c.name; }

class BadFile : public ::testing::TestWithParam<BadCase> {};

TEST_P(BadFile, IsAFormatErrorNamingFileColumnAndType) {
  TempDir dir;
  auto path = dir / (GetParam().name + ".parquet");
  run_oracle("data_parquet.py", {"bad", path.string(), GetParam().name});
  try {
    data::read_parquet(path);
    FAIL() << "no error";
  } catch (const FormatError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find(path.string()), std::string::npos) << m;
    for (const auto& s : GetParam().must_contain) EXPECT_NE(m.find(s), std::string::npos) << s << " not in: " << m;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Columns, BadFile,
    ::testing::Values(
        BadCase{"missing_prompt", {"missing column 'prompt'", "list<struct<content: string, role: string>>"}},
        BadCase{"ground_truth_int", {"'reward_model.ground_truth'", "int64", "expected string"}},
        BadCase{"index_string", {"'extra_info.index'", "expected int64"}},
        BadCase{"prompt_string", {"'prompt'", "list<struct<content: string, role: string>>"}},
        BadCase{"data_source_int", {"'data_source'", "int32", "expected string"}},
        BadCase{"missing_raw_problem", {"missing column 'extra_info.raw_problem'", "string"}},
        BadCase{"null_ground_truth", {"row 1", "'reward_model.ground_truth'", "null"}},
        BadCase{"missing_role", {"'prompt.element.role'", "string"}}),
    [](const auto& info) { return info.param.name; });

TEST(DataParquet, MissingOrNonParquetFileIsAnError) {
  TempDir dir;
  EXPECT_THROW(data::read_parquet(dir / "nope.parquet"), IoError);
  write_file_atomic(dir / "text.parquet", "not parquet at all");
  try {
    data::read_parquet(dir / "text.parquet");
    FAIL();
  } catch (const FormatError& e) {
    EXPECT_NE(std::string(e.what()).find("text.parquet"), std::string::npos);
  }
}

TEST(DataParquet, InspectReportsSchemaAndRowCount) {
  auto info = data::inspect_parquet(data_dir() / "amc-23.parquet");
  EXPECT_EQ(info.num_rows, 1280);
  EXPECT_NE(info.schema.find("extra_info: struct<index: int64, raw_problem: string, split: null>"), std::string::npos)
      << info.schema;
}

}  // namespace
}  // namespace rpg::test

namespace rpg {
namespace {

// Damaged copies of a real file: every truncation point and a byte flip at many offsets read
// as the original rows or fail with a FormatError naming the file -- never another exception
// or a crash (the fuzz target fuzz.parquet explores the rest).
TEST(DataParquet, DamagedBytesAreAFormatErrorOrTheSameRows) {
  const auto path = test::data_dir() / "amc-23.parquet";
  const std::string bytes = read_file(path);
  const auto original = data::read_parquet(path);
  ASSERT_EQ(data::read_parquet_bytes(bytes, "amc-23.parquet"), original);
  size_t errors = 0, reads = 0;
  auto attempt = [&](const std::string& damaged) {
    try {
      auto rows = data::read_parquet_bytes(damaged, "damaged.parquet");
      ++reads;
      EXPECT_LE(rows.size(), original.size());
    } catch (const FormatError& e) {
      ++errors;
      EXPECT_EQ(std::string(e.what()).rfind("damaged.parquet: ", 0), 0u) << e.what();
    }
  };
  for (size_t cut = 0; cut < bytes.size(); cut += 97) attempt(bytes.substr(0, cut));
  for (size_t at = 0; at < bytes.size(); at += 61) {
    std::string flipped = bytes;
    flipped[at] = static_cast<char>(flipped[at] ^ 0x5a);
    attempt(flipped);
  }
  EXPECT_GT(errors, 0u);
  EXPECT_EQ(errors + reads, (bytes.size() + 96) / 97 + (bytes.size() + 60) / 61);
}

}  // namespace
}  // namespace rpg
