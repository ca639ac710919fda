#include "rpg/data/dataset.h"

#include <arrow/api.h>
#include <arrow/io/file.h>
#include <arrow/io/memory.h>
#include <arrow/util/compression.h>
#include <parquet/arrow/reader.h>
#include <parquet/arrow/writer.h>
#include <parquet/exception.h>

#include "rpg/core/error.h"
#include "rpg/core/io.h"

namespace rpg::data {
namespace {

namespace fs = std::filesystem;

const char* kPromptType = "list<struct<content: string, role: string>>";
const char* kRewardModelType = "struct<ground_truth: string, style: string>";
const char* kExtraInfoType = "struct<index: int64, raw_problem: string, split: string>";

// A damaged header can claim gigabytes of pages in a file of a few kilobytes (found by
// fuzz.parquet). Decoding is capped at 256 MiB plus 512 bytes per file byte: far above what
// real text columns expand to, far below what would take the machine down. Over the cap,
// Arrow returns OutOfMemory and the file is reported as unreadable.
int64_t decode_budget(int64_t file_bytes) { return (int64_t{256} << 20) + 512 * file_bytes; }

std::unique_ptr<parquet::arrow::FileReader> open_reader(std::shared_ptr<arrow::io::RandomAccessFile> input,
                                                        const std::string& name,
                                                        arrow::MemoryPool* pool = arrow::default_memory_pool()) {
  auto reader = parquet::arrow::OpenFile(std::move(input), pool);
  if (!reader.ok()) throw FormatError(str(name, ": not a Parquet file: ", reader.status().message()));
  return std::move(*reader);
}

std::shared_ptr<arrow::io::ReadableFile> open_file(const fs::path& path) {
  if (!fs::exists(path)) throw IoError(str(path.string(), ": no such file"));
  auto file = arrow::io::ReadableFile::Open(path.string());
  if (!file.ok()) throw IoError(str(path.string(), ": cannot open: ", file.status().message()));
  return *file;
}

std::shared_ptr<arrow::Table> read_table(parquet::arrow::FileReader& reader, const std::string& name) {
  std::shared_ptr<arrow::Table> table;
  // Corrupt files can make the Parquet reader throw its own exception types.
  try {
    auto read = reader.ReadTable();
    if (!read.ok()) throw FormatError(str(name, ": cannot read: ", read.status().message()));
    table = *read;
  } catch (const parquet::ParquetException& e) {
    throw FormatError(str(name, ": cannot read: ", e.what()));
  }
  auto combined = table->CombineChunks();
  if (!combined.ok()) throw FormatError(str(name, ": cannot read: ", combined.status().message()));
  auto valid = (*combined)->ValidateFull();
  if (!valid.ok()) throw FormatError(str(name, ": corrupt data: ", valid.message()));
  return *combined;
}

// Column access with the error messages of the schema check.
class Reader {
 public:
  explicit Reader(fs::path path) : path_(std::move(path)) {}

  [[noreturn]] void mistyped(const std::string& column, const std::string& expected,
                             const std::shared_ptr<arrow::DataType>& got) const {
    throw FormatError(str(path_.string(), ": column '", column, "' has type ", got->ToString(), ", expected ",
                          expected));
  }
  [[noreturn]] void missing(const std::string& column, const std::string& expected) const {
    throw FormatError(str(path_.string(), ": missing column '", column, "' (expected ", expected, ")"));
  }
  [[noreturn]] void null_value(const std::string& column, int64_t row) const {
    throw FormatError(str(path_.string(), ": row ", row, ": column '", column, "' is null"));
  }

  std::shared_ptr<arrow::Array> column(const arrow::Table& t, const std::string& name, const char* expected) const {
    auto col = t.GetColumnByName(name);
    if (!col) missing(name, expected);
    if (col->num_chunks() == 0) {
      auto empty = arrow::MakeEmptyArray(col->type());
      if (!empty.ok()) throw FormatError(str(path_.string(), ": ", empty.status().message()));
      return *empty;
    }
    return col->chunk(0);
  }

  std::shared_ptr<arrow::Array> field(const std::shared_ptr<arrow::Array>& parent, const std::string& parent_name,
                                      const std::string& name, const char* parent_expected,
                                      const char* expected) const {
    if (parent->type_id() != arrow::Type::STRUCT) mistyped(parent_name, parent_expected, parent->type());
    auto st = std::static_pointer_cast<arrow::StructArray>(parent);
    auto f = st->GetFieldByName(name);
    if (!f) missing(parent_name + "." + name, expected);
    return f;
  }

  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// A string column (string or large_string); `nullable` allows Arrow's null type and nulls.
class Strings {
 public:
  Strings(const Reader& r, std::shared_ptr<arrow::Array> a, std::string name, bool nullable)
      : r_(r), a_(std::move(a)), name_(std::move(name)), nullable_(nullable) {
    auto id = a_->type_id();
    if (id == arrow::Type::STRING) small_ = static_cast<const arrow::StringArray*>(a_.get());
    else if (id == arrow::Type::LARGE_STRING) large_ = static_cast<const arrow::LargeStringArray*>(a_.get());
    else if (!(nullable_ && id == arrow::Type::NA)) r_.mistyped(name_, nullable_ ? "string or null" : "string", a_->type());
  }
  std::optional<std::string> get(int64_t i, int64_t row) const {
    if (a_->IsNull(i)) {
      if (!nullable_) r_.null_value(name_, row);
      return std::nullopt;
    }
    if (small_) return std::string(small_->GetView(i));
    return std::string(large_->GetView(i));
  }
  std::string required(int64_t i) const { return *get(i, i); }

 private:
  const Reader& r_;
  std::shared_ptr<arrow::Array> a_;
  std::string name_;
  bool nullable_;
  const arrow::StringArray* small_ = nullptr;
  const arrow::LargeStringArray* large_ = nullptr;
};

std::shared_ptr<arrow::Schema> schema() {
  auto message = arrow::struct_({arrow::field("content", arrow::utf8()), arrow::field("role", arrow::utf8())});
  return arrow::schema({
      arrow::field("data_source", arrow::utf8()),
      arrow::field("prompt", arrow::list(arrow::field("element", message))),
      arrow::field("ability", arrow::utf8()),
      arrow::field("reward_model",
                   arrow::struct_({arrow::field("ground_truth", arrow::utf8()), arrow::field("style", arrow::utf8())})),
      arrow::field("extra_info", arrow::struct_({arrow::field("index", arrow::int64()),
                                                 arrow::field("raw_problem", arrow::utf8()),
                                                 arrow::field("split", arrow::utf8())})),
  });
}

void check(const arrow::Status& st, const fs::path& path) {
  if (!st.ok()) throw FormatError(str(path.string(), ": cannot build the Parquet table: ", st.message()));
}

std::vector<Row> rows_of(const arrow::Table& table_ref, const fs::path& path) {
  const arrow::Table* table = &table_ref;
  Reader r(path);
  const int64_t n = table->num_rows();

  Strings data_source(r, r.column(*table, "data_source", "string"), "data_source", false);
  Strings ability(r, r.column(*table, "ability", "string"), "ability", false);

  auto prompt = r.column(*table, "prompt", kPromptType);
  if (prompt->type_id() != arrow::Type::LIST) r.mistyped("prompt", kPromptType, prompt->type());
  auto prompt_list = std::static_pointer_cast<arrow::ListArray>(prompt);
  auto messages = prompt_list->values();
  if (messages->type_id() != arrow::Type::STRUCT) r.mistyped("prompt", kPromptType, prompt->type());
  Strings content(r, r.field(messages, "prompt.element", "content", kPromptType, "string"), "prompt.element.content", false);
  Strings role(r, r.field(messages, "prompt.element", "role", kPromptType, "string"), "prompt.element.role", false);

  auto reward_model = r.column(*table, "reward_model", kRewardModelType);
  Strings ground_truth(r, r.field(reward_model, "reward_model", "ground_truth", kRewardModelType, "string"),
                       "reward_model.ground_truth", false);
  Strings style(r, r.field(reward_model, "reward_model", "style", kRewardModelType, "string"), "reward_model.style",
                false);

  auto extra_info = r.column(*table, "extra_info", kExtraInfoType);
  auto index = r.field(extra_info, "extra_info", "index", kExtraInfoType, "int64");
  if (!arrow::is_integer(index->type_id())) r.mistyped("extra_info.index", "int64", index->type());
  Strings raw_problem(r, r.field(extra_info, "extra_info", "raw_problem", kExtraInfoType, "string"),
                      "extra_info.raw_problem", false);
  Strings split(r, r.field(extra_info, "extra_info", "split", kExtraInfoType, "string or null"), "extra_info.split",
                true);

  const auto* index64 = index->type_id() == arrow::Type::INT64 ? static_cast<const arrow::Int64Array*>(index.get()) : nullptr;
  auto integer_at = [&](int64_t i) -> int64_t {
    if (index->IsNull(i)) r.null_value("extra_info.index", i);
    if (index64) return index64->Value(i);
    auto scalar = index->GetScalar(i);
    if (!scalar.ok()) r.null_value("extra_info.index", i);
    auto as64 = (*scalar)->CastTo(arrow::int64());
    if (!as64.ok()) r.mistyped("extra_info.index", "int64", index->type());
    return std::static_pointer_cast<arrow::Int64Scalar>(*as64)->value;
  };

  std::vector<Row> rows(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Row& row = rows[static_cast<size_t>(i)];
    row.data_source = data_source.required(i);
    row.ability = ability.required(i);
    if (prompt_list->IsNull(i)) r.null_value("prompt", i);
    for (int64_t m = prompt_list->value_offset(i), end = m + prompt_list->value_length(i); m < end; ++m) {
      if (messages->IsNull(m)) r.null_value("prompt.element", i);
      row.prompt.push_back({*content.get(m, i), *role.get(m, i)});
    }
    if (reward_model->IsNull(i)) r.null_value("reward_model", i);
    row.reward_model = {ground_truth.required(i), style.required(i)};
    if (extra_info->IsNull(i)) r.null_value("extra_info", i);
    row.extra_info.index = integer_at(i);
    row.extra_info.raw_problem = raw_problem.required(i);
    row.extra_info.split = split.get(i, i);
  }
  return rows;
}

}  // namespace

std::vector<Row> read_parquet(const fs::path& path) {
  auto file = open_file(path);
  auto size = file->GetSize();
  if (!size.ok()) throw IoError(str(path.string(), ": cannot read: ", size.status().message()));
  arrow::CappedMemoryPool pool(arrow::default_memory_pool(), decode_budget(*size));  // outlives the table
  return rows_of(*read_table(*open_reader(file, path.string(), &pool), path.string()), path);
}

std::vector<Row> read_prompt_rows(const fs::path& path, const std::string& what) {
  auto rows = read_parquet(path);
  if (rows.empty()) throw FormatError(str(what, " ", path.string(), ": no rows (nothing to sample prompts from)"));
  for (size_t i = 0; i < rows.size(); ++i)
    if (rows[i].prompt.empty())
      throw FormatError(str(what, " ", path.string(), ": row ", i, ": the prompt holds no message"));
  return rows;
}

std::vector<Row> read_parquet_bytes(std::string_view bytes, const std::string& name) {
  auto buffer = std::make_shared<arrow::Buffer>(reinterpret_cast<const uint8_t*>(bytes.data()),
                                                static_cast<int64_t>(bytes.size()));
  auto input = std::make_shared<arrow::io::BufferReader>(buffer);
  arrow::CappedMemoryPool pool(arrow::default_memory_pool(), decode_budget(static_cast<int64_t>(bytes.size())));
  return rows_of(*read_table(*open_reader(input, name, &pool), name), name);
}

void write_parquet(const fs::path& path, std::span<const Row> rows) {
  auto sch = schema();
  auto pool = arrow::default_memory_pool();
  arrow::StringBuilder data_source(pool), ability(pool);

  auto message_type = std::static_pointer_cast<arrow::ListType>(sch->GetFieldByName("prompt")->type())->value_type();
  auto content_b = std::make_shared<arrow::StringBuilder>(pool);
  auto role_b = std::make_shared<arrow::StringBuilder>(pool);
  auto message_b = std::make_shared<arrow::StructBuilder>(message_type, pool,
                                                          std::vector<std::shared_ptr<arrow::ArrayBuilder>>{content_b, role_b});
  arrow::ListBuilder prompt(pool, message_b, sch->GetFieldByName("prompt")->type());

  auto gt_b = std::make_shared<arrow::StringBuilder>(pool);
  auto style_b = std::make_shared<arrow::StringBuilder>(pool);
  arrow::StructBuilder reward_model(sch->GetFieldByName("reward_model")->type(), pool, {gt_b, style_b});

  auto index_b = std::make_shared<arrow::Int64Builder>(pool);
  auto raw_b = std::make_shared<arrow::StringBuilder>(pool);
  auto split_b = std::make_shared<arrow::StringBuilder>(pool);
  arrow::StructBuilder extra_info(sch->GetFieldByName("extra_info")->type(), pool, {index_b, raw_b, split_b});

  for (const Row& row : rows) {
    check(data_source.Append(row.data_source), path);
    check(ability.Append(row.ability), path);
    check(prompt.Append(), path);
    for (const Message& m : row.prompt) {
      check(message_b->Append(), path);
      check(content_b->Append(m.content), path);
      check(role_b->Append(m.role), path);
    }
    check(reward_model.Append(), path);
    check(gt_b->Append(row.reward_model.ground_truth), path);
    check(style_b->Append(row.reward_model.style), path);
    check(extra_info.Append(), path);
    check(index_b->Append(row.extra_info.index), path);
    check(raw_b->Append(row.extra_info.raw_problem), path);
    check(row.extra_info.split ? split_b->Append(*row.extra_info.split) : split_b->AppendNull(), path);
  }
  std::vector<std::shared_ptr<arrow::Array>> columns(5);
  check(data_source.Finish(&columns[0]), path);
  check(prompt.Finish(&columns[1]), path);
  check(ability.Finish(&columns[2]), path);
  check(reward_model.Finish(&columns[3]), path);
  check(extra_info.Finish(&columns[4]), path);
  auto table = arrow::Table::Make(sch, columns, static_cast<int64_t>(rows.size()));
  check(table->Validate(), path);

  auto sink = arrow::io::BufferOutputStream::Create(1 << 20, pool);
  if (!sink.ok()) check(sink.status(), path);
  parquet::WriterProperties::Builder props;
  if (arrow::util::Codec::IsAvailable(arrow::Compression::SNAPPY)) props.compression(arrow::Compression::SNAPPY);
  check(parquet::arrow::WriteTable(*table, pool, *sink, /*chunk_size=*/64 * 1024, props.build()), path);
  auto buffer = (*sink)->Finish();
  if (!buffer.ok()) check(buffer.status(), path);
  write_file_atomic(path, std::string_view(reinterpret_cast<const char*>((*buffer)->data()),
                                           static_cast<size_t>((*buffer)->size())));
}

ParquetInfo inspect_parquet(const fs::path& path) {
  auto reader = open_reader(open_file(path), path.string());
  std::shared_ptr<arrow::Schema> sch;
  auto st = reader->GetSchema(&sch);
  if (!st.ok()) throw FormatError(str(path.string(), ": cannot read the schema: ", st.message()));
  ParquetInfo info;
  info.schema = sch->ToString(/*show_metadata=*/false);
  auto md = reader->parquet_reader()->metadata();
  info.num_rows = md->num_rows();
  info.num_row_groups = md->num_row_groups();
  return info;
}

}  // namespace rpg::data
