// RL / eval datasets in the paper's Parquet schema (verl's), one row per (problem, repeat):
//   data_source   string
//   prompt        list<element: struct<content: string, role: string>>   chat messages
//   ability       string                                                 "MATH"
//   reward_model  struct<ground_truth: string, style: string>
//   extra_info    struct<index: int64, raw_problem: string, split: string (nullable)>
// Reading accepts what pandas / pyarrow write (string or large_string; split may be Arrow's
// null type when every value is null; other columns are ignored). Arrow stays inside
// dataset.cpp: this header is plain C++.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rpg::data {

struct Message {
  std::string content;
  std::string role;  // "user", "system", "assistant"
  bool operator==(const Message&) const = default;
};

struct RewardModel {
  std::string ground_truth;
  std::string style = "rule-lighteval/MATH_v2";
  bool operator==(const RewardModel&) const = default;
};

struct ExtraInfo {
  int64_t index = 0;                 // repeat number 0..k-1 (acc@k)
  std::string raw_problem;           // the problem without the prompt template
  std::optional<std::string> split;  // null in the paper's files
  bool operator==(const ExtraInfo&) const = default;
};

struct Row {
  std::string data_source;  // selects the reward scorer
  std::vector<Message> prompt;
  std::string ability = "MATH";
  RewardModel reward_model;
  ExtraInfo extra_info;
  bool operator==(const Row&) const = default;
};

// Reads every row. Throws IoError when the file cannot be opened, FormatError naming the
// file and the column (e.g. "reward_model.ground_truth") with the expected type when a
// column is missing or mistyped, or the file and row when a required value is null.
std::vector<Row> read_parquet(const std::filesystem::path& path);
// extra_info as the JSON object verl hands a reward function ({"index", "raw_problem", "split"}).
std::string extra_info_json(const ExtraInfo& info);

// read_parquet for the prompts a command samples from (train, validation, eval, generate):
// a file without rows, or a row whose prompt holds no message, is a FormatError naming
// `what` (the key or flag that named the file), the file and the row.
std::vector<Row> read_prompt_rows(const std::filesystem::path& path, const std::string& what);

// The same from a file's bytes in memory; `name` stands for the file in error messages.
// Damaged bytes are a FormatError, never a crash (fuzzed: tests/data/fuzz_parquet.cpp).
std::vector<Row> read_parquet_bytes(std::string_view bytes, const std::string& name);

// Writes the rows in the schema above (split as a nullable string), atomically: the file
// appears complete or not at all. Throws IoError / FormatError.
void write_parquet(const std::filesystem::path& path, std::span<const Row> rows);

struct ParquetInfo {
  std::string schema;  // Arrow's text rendering of the file's schema
  int64_t num_rows = 0;
  int num_row_groups = 0;
};
// The schema and size of any Parquet file (no schema check).
ParquetInfo inspect_parquet(const std::filesystem::path& path);

}  // namespace rpg::data
