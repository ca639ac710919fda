// From plain {problem, answer} records (JSONL or CSV) to rows of the paper's schema:
// the prompt template, a chosen data_source, and acc@k repetition.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rpg/data/dataset.h"

namespace rpg::data {

// The paper's prompt (DAPO's): the instruction, a blank line, the problem, a blank line,
// the reminder to end with "Answer:".
std::string apply_prompt_template(std::string_view problem);

// How a problem becomes the prompt's chat messages.
//   kDapo     one user message in the paper's (DAPO's) template (the default)
//   kFewShot  a system line, two worked exchanges ("What is 4 + 3?" -> "Answer: 7",
//             "What is 12 + 5?" -> "Answer: 17") and the problem as the last user message:
//             a small instruct model (SmolLM2-135M-Instruct) then answers in the "Answer:"
//             form the DAPO rule reads (with the DAPO template it almost never does)
enum class PromptStyle { kDapo, kFewShot };
// "dapo" / "fewshot"; ValueError naming the choices otherwise.
PromptStyle parse_prompt_style(std::string_view name);

struct FewShotExample {
  int64_t a, b;
};
inline constexpr FewShotExample kFewShotExamples[2] = {{4, 3}, {12, 5}};

// The prompt's messages (content, role) for `problem` in `style`.
std::vector<Message> prompt_messages(std::string_view problem, PromptStyle style);

struct ProblemRecord {
  std::string problem;
  std::string answer;
};

struct RecordColumns {
  std::string problem = "problem";  // key / header of the problem text
  std::string answer = "answer";    // key / header of the answer (JSON numbers become their text)
};

// JSON Lines: one object per non-blank line. FormatError names the file, line and key.
std::vector<ProblemRecord> read_jsonl_records(const std::filesystem::path& path, const RecordColumns& columns = {});
// CSV (RFC 4180: quoted fields, "" escapes, newlines inside quotes) with a header row.
std::vector<ProblemRecord> read_csv_records(const std::filesystem::path& path, const RecordColumns& columns = {});
// The same parsers on text in memory; `source` names it in error messages.
std::vector<ProblemRecord> parse_jsonl_records(std::string_view text, const std::string& source,
                                               const RecordColumns& columns = {});
std::vector<ProblemRecord> parse_csv_records(std::string_view text, const std::string& source,
                                             const RecordColumns& columns = {});
// By extension: .jsonl / .json / .ndjson -> JSONL, .csv -> CSV; otherwise a UsageError.
std::vector<ProblemRecord> read_records(const std::filesystem::path& path, const RecordColumns& columns = {});

struct PrepareOptions {
  std::string data_source = "math_dapo";
  std::string ability = "MATH";
  std::string style = "rule-lighteval/MATH_v2";
  std::optional<std::string> split;  // extra_info.split (null by default, as in the paper's files)
  int64_t repeat = 1;                // k: each problem repeated with extra_info.index 0..k-1
  PromptStyle prompt_style = PromptStyle::kDapo;
};

// Problem-major order: the k repeats of problem 0, then of problem 1, ...
// ValueError when repeat < 1 or data_source is empty.
std::vector<Row> prepare_rows(const std::vector<ProblemRecord>& records, const PrepareOptions& options);

}  // namespace rpg::data
