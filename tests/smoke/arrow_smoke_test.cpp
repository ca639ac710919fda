// Arrow/Parquet from the pyarrow wheel is linked and reads the paper's data files: the
// schema matches system.md and the row count matches pyarrow's (a live oracle).
#include <arrow/api.h>
#include <arrow/io/file.h>
#include <gtest/gtest.h>
#include <parquet/arrow/reader.h>

#include <string>

#include "test_util.h"

namespace {

std::shared_ptr<arrow::Table> read_table(const std::string& path) {
  auto file = arrow::io::ReadableFile::Open(path);
  EXPECT_TRUE(file.ok()) << file.status().ToString();
  auto reader = parquet::arrow::OpenFile(*file, arrow::default_memory_pool());
  EXPECT_TRUE(reader.ok()) << reader.status().ToString();
  auto table = (*reader)->ReadTable();
  EXPECT_TRUE(table.ok()) << table.status().ToString();
  return table.ok() ? *table : nullptr;
}

void expect_struct_fields(const std::shared_ptr<arrow::DataType>& type,
                          const std::vector<std::pair<std::string, arrow::Type::type>>& fields) {
  ASSERT_EQ(type->id(), arrow::Type::STRUCT) << type->ToString();
  auto st = std::static_pointer_cast<arrow::StructType>(type);
  for (const auto& [name, id] : fields) {
    auto f = st->GetFieldByName(name);
    ASSERT_NE(f, nullptr) << "missing field " << name << " in " << type->ToString();
    EXPECT_EQ(f->type()->id(), id) << name << ": " << f->type()->ToString();
  }
}

class ArrowSmoke : public ::testing::TestWithParam<std::string> {};

TEST_P(ArrowSmoke, SchemaAndRowCountMatchPyarrow) {
  std::string path = (rpg::test::data_dir() / GetParam()).string();
  auto table = read_table(path);
  ASSERT_NE(table, nullptr);
  auto schema = table->schema();

  auto col = [&](const std::string& name) {
    auto f = schema->GetFieldByName(name);
    EXPECT_NE(f, nullptr) << "missing column " << name;
    return f ? f->type() : arrow::null();
  };
  EXPECT_EQ(col("data_source")->id(), arrow::Type::STRING);
  EXPECT_EQ(col("ability")->id(), arrow::Type::STRING);
  auto prompt = col("prompt");
  ASSERT_EQ(prompt->id(), arrow::Type::LIST) << prompt->ToString();
  expect_struct_fields(std::static_pointer_cast<arrow::ListType>(prompt)->value_type(),
                       {{"content", arrow::Type::STRING}, {"role", arrow::Type::STRING}});
  expect_struct_fields(col("reward_model"), {{"ground_truth", arrow::Type::STRING}, {"style", arrow::Type::STRING}});
  expect_struct_fields(col("extra_info"), {{"index", arrow::Type::INT64}, {"raw_problem", arrow::Type::STRING}});
  // split is "string or null": pandas writes an all-null column as Arrow's null type.
  auto split = std::static_pointer_cast<arrow::StructType>(col("extra_info"))->GetFieldByName("split");
  ASSERT_NE(split, nullptr);
  EXPECT_TRUE(split->type()->id() == arrow::Type::STRING || split->type()->id() == arrow::Type::NA);

  auto oracle = rpg::test::run_oracle("parquet_info.py", {path});
  EXPECT_EQ(std::to_string(table->num_rows()) + "\n", oracle.out);
  EXPECT_GT(table->num_rows(), 0);

  // Every prompt is one user message wrapped in the paper's template.
  auto prompts = std::static_pointer_cast<arrow::ListArray>(table->GetColumnByName("prompt")->chunk(0));
  auto messages = std::static_pointer_cast<arrow::StructArray>(prompts->values());
  auto content = std::static_pointer_cast<arrow::StringArray>(messages->GetFieldByName("content"));
  auto role = std::static_pointer_cast<arrow::StringArray>(messages->GetFieldByName("role"));
  ASSERT_GT(content->length(), 0);
  EXPECT_EQ(role->GetString(0), "user");
  EXPECT_EQ(content->GetString(0).rfind("Solve the following math problem step by step.", 0), 0u);
}

INSTANTIATE_TEST_SUITE_P(PaperData, ArrowSmoke, ::testing::Values("aime-2024.parquet", "amc-23.parquet"),
                         [](const auto& info) { return info.param.substr(0, info.param.find('-')); });

}  // namespace
