// docs/errors.md is executable: every row of its table between <!-- errors:begin --> and
// <!-- errors:end --> is run here (one test per row) and must print exactly its message
// with its exit code. The fixtures the rows name are made here, as the doc describes them.
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <thread>

#include "run_fixture.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

struct Row {
  int line = 0;
  std::string area, env, command, message;
  int exit = -1;
};

void PrintTo(const Row& r, std::ostream* os) { *os << "docs/errors.md:" << r.line << " " << r.command; }

std::string trim(std::string s) {
  s.erase(0, s.find_first_not_of(" \t"));
  s.erase(s.find_last_not_of(" \t") + 1);
  return s;
}

std::string unquote(const std::string& cell) {
  const std::string t = trim(cell);
  if (t.size() >= 2 && t.front() == '`' && t.back() == '`') return t.substr(1, t.size() - 2);
  return t;
}

std::vector<Row> read_rows() {
  std::ifstream in(test::source_dir() / "docs" / "errors.md");
  std::vector<Row> rows;
  std::string line;
  bool inside = false;
  int n = 0, header = 0;
  while (std::getline(in, line)) {
    ++n;
    if (line == "<!-- errors:begin -->") inside = true;
    else if (line == "<!-- errors:end -->") inside = false;
    else if (inside && line.rfind("|", 0) == 0) {
      if (header++ < 2) continue;  // the header and its |---| line
      // Cells: | area | env | command | exit | message |; a '|' inside the message is kept.
      std::vector<std::string> cells;
      std::string body = line.substr(1);
      if (!body.empty() && body.back() == '|') body.pop_back();
      size_t start = 0;
      for (int c = 0; c < 4; ++c) {
        const size_t bar = body.find('|', start);
        if (bar == std::string::npos) break;
        cells.push_back(body.substr(start, bar - start));
        start = bar + 1;
      }
      cells.push_back(body.substr(start));
      if (cells.size() != 5) throw std::runtime_error("docs/errors.md:" + std::to_string(n) + ": expected 5 cells");
      Row r;
      r.line = n;
      r.area = trim(cells[0]);
      r.env = unquote(cells[1]);
      r.command = unquote(cells[2]);
      r.exit = std::stoi(trim(cells[3]));
      r.message = unquote(cells[4]);
      rows.push_back(std::move(r));
    }
  }
  return rows;
}

std::vector<std::string> split_words(const std::string& s) {
  std::vector<std::string> out;
  std::istringstream in(s);
  std::string w;
  while (in >> w) out.push_back(w);
  return out;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

class ErrorCatalogue : public ::testing::TestWithParam<Row> {
 protected:
  static void SetUpTestSuite() {
    model_ = new fs::path(test::oracle_output_dir("tiny_chat_model.py") / "model");
    dir_ = new test::TempDir();
    const fs::path& d = dir_->path();
    const fs::path& m = *model_;
    test::write_text(d / "p.jsonl", "{\"problem\": \"1+1?\", \"answer\": \"2\"}\n");
    auto r = test::run_process({test::rpg_binary().string(), "data", "prepare", (d / "p.jsonl").string(),
                                (d / "p.parquet").string(), "--data-source", "math_dapo"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    test::write_text(d / "bad.yaml", "trainer: [unclosed\n");
    test::write_text(d / "badtype.yaml", "trainer:\n  total_epochs: many\n");
    fs::create_directories(d / "empty_model");
    test::write_text(d / "lora_actor" / "adapter_config.json", "{}\n");  // a LoRA run's actor/
    // One JSONL line over the 64 MiB budget (core/jsonl.h).
    test::write_text(d / "long.jsonl",
                     "{\"problem\": \"" + std::string((size_t{64} << 20) + 1, 'x') + "\", \"answer\": \"2\"}\n");
    test::write_text(d / "model_badjson" / "config.json", "{\n");
    test::write_text(d / "model_noweights" / "config.json", read_file(m / "config.json"));
    for (const char* copy : {"model_badtok", "model_badst", "model_badtpl", "model_dupid", "model_hugetok"})
      fs::copy(m, d / copy, fs::copy_options::recursive);
    fs::resize_file(d / "model_hugetok" / "tokenizer.json", std::uintmax_t{1} << 30);  // sparse: nothing read
    test::write_text(d / "model_badtok" / "tokenizer.json", "not json\n");
    test::write_text(d / "model_badst" / "model.safetensors", read_file(m / "model.safetensors").substr(0, 100));
    {
      auto tj = nlohmann::json::parse(read_file(m / "tokenizer.json"));
      tj["model"]["vocab"]["zz_dup"] = tj["model"]["vocab"]["a"];
      test::write_text(d / "model_dupid" / "tokenizer.json", tj.dump());
    }
    auto cfg = nlohmann::json::parse(read_file(m / "tokenizer_config.json"));
    cfg["chat_template"] = "{% for m in messages %}{{ m.content }";
    test::write_text(d / "model_badtpl" / "tokenizer_config.json", cfg.dump());
    test::write_text(d / "garbage.parquet", "hello\n");
    r = test::run_process({test::python().string(), "-c",
                           "import pyarrow as pa, pyarrow.parquet as pq; pq.write_table(pa.table({'x': [1]}), '" +
                               (d / "schema.parquet").string() + "')"});
    ASSERT_EQ(r.exit_code, 0) << "pyarrow (the venv's) is needed to write schema.parquet: " << r.err;
    // p.parquet's schema with no rows, and its row with an empty message list.
    test::edit_parquet(d, "empty.parquet", "out = t.slice(0, 0)");
    test::edit_parquet(d, "noprompt.parquet",
                       "out = t.set_column(i, 'prompt', pa.array([[]] * t.num_rows, type=t.schema.field(i).type))");
    test::write_text(d / "nokey.jsonl", "{\"question\": \"1+1?\"}\n");
    test::write_text(d / "bad.jsonl", "not json\n");
    test::write_text(d / "sft_bad.jsonl", "{\"prompt\": \"x\"}\n");
    test::write_text(d / "resp_nokey.jsonl", "{\"x\": 1}\n");
    test::write_text(d / "newer" / "global_step_1" / "train_state.json", "{\"format_version\": 99, \"step\": 1}\n");
    fs::create_directories(d / "incomplete");
    test::write_text(d / "damaged" / "global_step_1" / "train_state.json", "{\n");
    test::write_text(d / "damaged" / "latest_checkpointed_iteration.txt", "1\n");
    test::write_text(d / "locked" / "rpg.lock", "pid 1 host another-node-0042\n");
    std::string bomb = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
    for (char c = 'b'; c <= 'i'; ++c) {
      bomb += std::string(1, c) + ": &" + c + " [";
      for (int k = 0; k < 9; ++k) bomb += std::string(k ? ", *" : "*") + static_cast<char>(c - 1);
      bomb += "]\n";
    }
    test::write_text(d / "bomb.yaml", bomb);
    test::write_text(d / "deep.yaml", "a: " + std::string(100, '[') + std::string(100, ']') + "\n");
  }
  static void TearDownTestSuite() {
    delete dir_;
    delete model_;
  }
  static fs::path* model_;
  static test::TempDir* dir_;
};
fs::path* ErrorCatalogue::model_ = nullptr;
test::TempDir* ErrorCatalogue::dir_ = nullptr;

TEST_P(ErrorCatalogue, RowPrintsItsMessageAndExitCode) {
  const Row& row = GetParam();
  const std::string train =
      "data.train_files=p.parquet data.train_batch_size=1 data.max_response_length=4 actor_rollout_ref.rollout.n=1 "
      "actor_rollout_ref.actor.ppo_mini_batch_size=1 trainer.device=cpu actor_rollout_ref.model.path={model}";
  const std::string command = replace_all(replace_all(row.command, "{train}", train), "{model}", model_->string());
  const unsigned cores = std::max(1u, std::thread::hardware_concurrency());
  const std::string message =
      replace_all(replace_all(replace_all(row.message, "{model}", model_->string()), "{ranks}", std::to_string(cores * 8)),
                  "{cores}", std::to_string(cores));
  // In the scratch directory, so the relative paths of the doc are the fixtures.
  std::string script = "cd '" + dir_->path().string() + "' && exec env";
  for (const auto& kv : split_words(row.env)) script += " '" + kv + "'";
  script += " '" + test::rpg_binary().string() + "'";
  for (const auto& w : split_words(command)) script += " '" + w + "'";
  const auto r = test::run_process({"/bin/sh", "-c", script});
  std::string first;
  for (const auto& l : test::lines_starting(r.err, "rpg: ")) {
    if (l.rfind("rpg: error: ", 0) == 0 || l.rfind("rpg: preempted: ", 0) == 0) {
      first = l;
      break;
    }
  }
  EXPECT_EQ(r.exit_code, row.exit) << "docs/errors.md:" << row.line << "\n" << r.err;
  EXPECT_EQ(first, message) << "docs/errors.md:" << row.line << " (" << row.area << ")\n" << r.err;
}

std::string row_name(const ::testing::TestParamInfo<Row>& info) {
  std::string name = "line" + std::to_string(info.param.line) + "_" + info.param.area;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(DocsErrorsMd, ErrorCatalogue, ::testing::ValuesIn(read_rows()), row_name);

TEST(ErrorCatalogueDoc, HasARowForEveryArea) {
  std::set<std::string> areas;
  for (const auto& r : read_rows()) areas.insert(r.area);
  for (const char* want : {"usage", "config", "model files", "tokenizer.json", "chat template", "Parquet schema",
                           "responses", "checkpoints", "run directory", "full disk", "preemption", "distributed launch"})
    EXPECT_TRUE(areas.count(want)) << "docs/errors.md has no row for " << want;
}

}  // namespace
}  // namespace rpg
