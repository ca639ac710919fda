#include "rpg/data/prepare.h"

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/jsonl.h"

namespace rpg::data {
namespace {

namespace fs = std::filesystem;

constexpr std::string_view kPromptBefore =
    "Solve the following math problem step by step. The last line of your response should be of the form "
    "Answer: $Answer (without quotes) where $Answer is the answer to the problem.\n\n";
constexpr std::string_view kPromptAfter = "\n\nRemember to put your answer on its own line after \"Answer:\".";

std::string field_text(const nlohmann::json& v, const std::string& source, size_t line, const std::string& key) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number() || v.is_boolean()) return v.dump();
  throw FormatError(str(source, ":", line, ": key '", key, "' must be a string or a number, got ", v.type_name()));
}

std::vector<std::vector<std::string>> parse_csv(std::string_view text, const std::string& source) {
  std::vector<std::vector<std::string>> rows;
  std::vector<std::string> row;
  std::string field;
  bool quoted = false, field_started = false;
  size_t line = 1;
  size_t i = 0;
  if (text.starts_with("\xEF\xBB\xBF")) i = 3;  // UTF-8 byte order mark
  auto end_field = [&] {
    row.push_back(std::move(field));
    field.clear();
    field_started = false;
  };
  auto end_row = [&] {
    end_field();
    if (!(row.size() == 1 && row[0].empty())) rows.push_back(std::move(row));
    row.clear();
  };
  for (; i < text.size(); ++i) {
    char c = text[i];
    if (quoted) {
      if (c == '"') {
        if (i + 1 < text.size() && text[i + 1] == '"') {
          field.push_back('"');
          ++i;
        } else {
          quoted = false;
        }
      } else {
        if (c == '\n') ++line;
        field.push_back(c);
      }
      continue;
    }
    if (c == '"' && !field_started) {
      quoted = field_started = true;
    } else if (c == ',') {
      end_field();
    } else if (c == '\n' || c == '\r') {
      if (c == '\r' && i + 1 < text.size() && text[i + 1] == '\n') ++i;
      end_row();
      ++line;
    } else {
      field.push_back(c);
      field_started = true;
    }
  }
  if (quoted) throw FormatError(str(source, ":", line, ": unterminated quoted field"));
  if (field_started || !row.empty() || !field.empty()) end_row();
  return rows;
}

}  // namespace

std::string apply_prompt_template(std::string_view problem) {
  std::string out;
  out.reserve(kPromptBefore.size() + problem.size() + kPromptAfter.size());
  out.append(kPromptBefore).append(problem).append(kPromptAfter);
  return out;
}

PromptStyle parse_prompt_style(std::string_view name) {
  if (name == "dapo") return PromptStyle::kDapo;
  if (name == "fewshot") return PromptStyle::kFewShot;
  throw ValueError(str("prompt style: got '", name, "', expected dapo or fewshot"));
}

std::vector<Message> prompt_messages(std::string_view problem, PromptStyle style) {
  if (style == PromptStyle::kDapo) return {{apply_prompt_template(problem), "user"}};
  std::vector<Message> out = {{"Answer with the result only.", "system"}};
  for (const FewShotExample& e : kFewShotExamples) {
    out.push_back({str("What is ", e.a, " + ", e.b, "?"), "user"});
    out.push_back({str("Answer: ", e.a + e.b), "assistant"});
  }
  out.push_back({std::string(problem), "user"});
  return out;
}

std::vector<ProblemRecord> parse_jsonl_records(std::string_view text, const std::string& source,
                                               const RecordColumns& columns) {
  std::vector<ProblemRecord> out;
  jsonl::parse(text, source, [&](size_t line_no, nlohmann::json& j) {
    ProblemRecord r;
    for (auto [key, dest] : {std::pair{&columns.problem, &r.problem}, std::pair{&columns.answer, &r.answer}}) {
      auto it = j.find(*key);
      if (it == j.end()) throw FormatError(str(source, ":", line_no, ": missing key '", *key, "'"));
      *dest = field_text(*it, source, line_no, *key);
    }
    out.push_back(std::move(r));
  }, {.allow_torn_last_line = false});
  return out;
}

std::vector<ProblemRecord> parse_csv_records(std::string_view text, const std::string& source,
                                             const RecordColumns& columns) {
  auto rows = parse_csv(text, source);
  if (rows.empty()) throw FormatError(str(source, ": empty CSV file (expected a header row)"));
  const auto& header = rows[0];
  auto col = [&](const std::string& name) {
    for (size_t c = 0; c < header.size(); ++c)
      if (header[c] == name) return c;
    std::string have;
    for (const auto& h : header) have += (have.empty() ? "" : ", ") + h;
    throw FormatError(str(source, ": no column '", name, "' in the header (have: ", have, ")"));
  };
  size_t p = col(columns.problem), a = col(columns.answer);
  std::vector<ProblemRecord> out;
  for (size_t i = 1; i < rows.size(); ++i) {
    if (rows[i].size() != header.size())
      throw FormatError(str(source, ": record ", i, " has ", rows[i].size(), " fields, the header has ", header.size()));
    out.push_back({rows[i][p], rows[i][a]});
  }
  return out;
}

namespace {
// A records file is read whole, then parsed into records beside it (about 3x its bytes at the
// peak): one that cannot fit in the memory available is refused from its size (issue 34).
std::string read_records_file(const fs::path& path) {
  std::error_code ec;
  if (fs::is_regular_file(path, ec)) {
    const auto size = fs::file_size(path, ec);
    const int64_t avail = available_memory_bytes();
    if (!ec && avail > 0 && 3.0 * double(size) > double(avail))
      throw ValueError(str(path.string(), ": ", format_bytes(double(size)), " read whole needs about ",
                           format_bytes(3.0 * double(size)), ", more than the ", format_bytes(double(avail)),
                           " of memory available; split the file"));
  }
  return read_file(path);
}
}  // namespace

std::vector<ProblemRecord> read_jsonl_records(const fs::path& path, const RecordColumns& columns) {
  return parse_jsonl_records(read_records_file(path), path.string(), columns);
}

std::vector<ProblemRecord> read_csv_records(const fs::path& path, const RecordColumns& columns) {
  return parse_csv_records(read_records_file(path), path.string(), columns);
}

std::vector<ProblemRecord> read_records(const fs::path& path, const RecordColumns& columns) {
  std::string ext = path.extension().string();
  if (ext == ".jsonl" || ext == ".json" || ext == ".ndjson") return read_jsonl_records(path, columns);
  if (ext == ".csv") return read_csv_records(path, columns);
  throw UsageError(str(path.string(), ": unknown input format '", ext, "' (expected .jsonl or .csv)"));
}

std::vector<Row> prepare_rows(const std::vector<ProblemRecord>& records, const PrepareOptions& options) {
  if (options.repeat < 1) throw ValueError(str("repeat: got ", options.repeat, ", expected >= 1"));
  if (options.data_source.empty()) throw ValueError("data_source: must not be empty");
  std::vector<Row> rows;
  rows.reserve(records.size() * static_cast<size_t>(options.repeat));
  for (const auto& rec : records) {
    Row base;
    base.data_source = options.data_source;
    base.prompt = prompt_messages(rec.problem, options.prompt_style);
    base.ability = options.ability;
    base.reward_model = {rec.answer, options.style};
    base.extra_info.raw_problem = rec.problem;
    base.extra_info.split = options.split;
    for (int64_t k = 0; k < options.repeat; ++k) {
      rows.push_back(base);
      rows.back().extra_info.index = k;
    }
  }
  return rows;
}

}  // namespace rpg::data
