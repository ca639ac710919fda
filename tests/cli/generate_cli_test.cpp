// `rpg generate` end to end on a tiny chat model made by Hugging Face libraries: the
// model's chat template, tokenizer and weights give the same greedy tokens and text as
// transformers' tokenizer + apply_chat_template + generate().
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "rpg/core/io.h"
#include "test_util.h"

namespace rpg {
namespace {

const std::vector<std::string> kPrompts = {"What is 2+3?", "Solve x^2 = 4. 答え", "  spaces\tand\nnewlines "};

class GenerateCli : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new test::TempDir();
    fixture_ = test::oracle_output_dir("tiny_chat_model.py", kPrompts);
    ref_ = new nlohmann::json(nlohmann::json::parse(read_file(fixture_ / "reference.json")));
  }
  static void TearDownTestSuite() {
    delete ref_;
    delete dir_;
  }
  static test::ProcessResult rpg(std::vector<std::string> args) {
    args.insert(args.begin(), test::rpg_binary().string());
    return test::run_process(args, {"OMP_NUM_THREADS=1"});
  }
  static std::string model() { return (fixture_ / "model").string(); }
  static std::vector<nlohmann::json> lines(const std::string& text) {
    std::vector<nlohmann::json> out;
    std::istringstream in(text);
    std::string line;
    while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
    return out;
  }
  static test::TempDir* dir_;
  static std::filesystem::path fixture_;
  static nlohmann::json* ref_;
};
test::TempDir* GenerateCli::dir_ = nullptr;
std::filesystem::path GenerateCli::fixture_;
nlohmann::json* GenerateCli::ref_ = nullptr;

TEST_F(GenerateCli, GreedyMatchesTransformersFromPrompts) {
  std::vector<std::string> args = {"generate", "--model", model(), "--temperature", "0", "--max-new-tokens", "12",
                                   "--output", (dir_->path() / "out.jsonl").string()};
  for (const auto& p : kPrompts) args.insert(args.end(), {"--prompt", p});
  auto r = rpg(args);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("generated 3 responses for 3 prompts"), std::string::npos) << r.err;
  auto got = lines(read_file(dir_->path() / "out.jsonl"));
  ASSERT_EQ(got.size(), kPrompts.size());
  for (size_t i = 0; i < got.size(); ++i) {
    const auto& ref = (*ref_)[i];
    EXPECT_EQ(got[i]["prompt"], ref["prompt"]) << i;
    EXPECT_EQ(got[i]["response_ids"], ref["response_ids"]) << i;
    EXPECT_EQ(got[i]["response"], ref["response"]) << i;
    const bool stopped = got[i]["response_ids"].size() < 12;
    EXPECT_EQ(got[i]["finish_reason"], stopped ? "stop" : "length") << i;
  }
}

TEST_F(GenerateCli, SamplesNPerPromptFromAParquetDataset) {
  test::write_text(dir_->path() / "problems.jsonl", "{\"problem\": \"1+1?\", \"answer\": \"2\"}\n"
                                                    "{\"problem\": \"2+2?\", \"answer\": \"4\"}\n");
  const std::string parquet = (dir_->path() / "problems.parquet").string();
  auto prep = rpg({"data", "prepare", (dir_->path() / "problems.jsonl").string(), parquet, "--data-source", "math_dapo"});
  ASSERT_EQ(prep.exit_code, 0) << prep.err;
  auto r = rpg({"generate", "--model", model(), "--data", parquet, "--n", "3", "--max-new-tokens", "6", "--seed", "4",
                "--no-progress"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto got = lines(r.out);
  ASSERT_EQ(got.size(), 6u);
  EXPECT_EQ(got[5]["prompt_index"], 1);
  EXPECT_EQ(got[5]["sample_index"], 2);
  EXPECT_EQ(got[5]["ground_truth"], "4");
  EXPECT_EQ(got[5]["data_source"], "math_dapo");
  EXPECT_NE(got[0]["prompt"].get<std::string>().find("Solve the following math problem step by step."),
            std::string::npos);
  // The same seed gives the same samples.
  auto again = rpg({"generate", "--model", model(), "--data", parquet, "--n", "3", "--max-new-tokens", "6", "--seed",
                    "4", "--no-progress", "--max-num-seqs", "1"});
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(lines(again.out), got);
}

// `rpg tokenize --chat` gives the ids transformers' tokenizer + chat template give, and
// `rpg model info` counts the parameters as transformers does.
TEST_F(GenerateCli, TokenizeAndModelInfoAgreeWithTransformers) {
  auto r = rpg({"tokenize", "--model", model(), "--chat", kPrompts[1]});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::string ids;
  for (const auto& id : (*ref_)[1]["prompt_ids"]) ids += (ids.empty() ? "" : ", ") + std::to_string(id.get<int64_t>());
  EXPECT_NE(r.out.find("[" + ids + "]\n"), std::string::npos) << r.out;
  auto info = nlohmann::json::parse(read_file(fixture_ / "model_info.json"));
  auto m = rpg({"model", "info", model()});
  ASSERT_EQ(m.exit_code, 0) << m.err;
  const std::string count = std::to_string(info["num_parameters"].get<int64_t>());
  EXPECT_NE(m.out.find(count), std::string::npos) << m.out << " expected " << count;
  EXPECT_NE(m.out.find("qwen2"), std::string::npos) << m.out;
  auto bad = rpg({"model", "info", (dir_->path() / "missing").string()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("missing"), std::string::npos);
}

TEST_F(GenerateCli, BadRequestsAreOneLineErrors) {
  auto check = [](const test::ProcessResult& r, int code, const std::string& fragment) {
    EXPECT_EQ(r.exit_code, code) << r.err;
    EXPECT_EQ(r.err.rfind("rpg: error: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(fragment), std::string::npos) << r.err;
  };
  check(rpg({"generate", "--prompt", "x"}), 2, "--model DIR is required");
  check(rpg({"generate", "--model", (dir_->path() / "nope").string(), "--prompt", "x"}), 1, "nope");
  check(rpg({"generate", "--model", model(), "--prompt", "x", "--top-p", "1.5"}), 2, "--top-p must be in (0, 1]");
  check(rpg({"generate", "--model", model(), "--prompt", "x", "--max-new-tokens", "0"}), 2, "--max-new-tokens must be in");
  check(rpg({"generate", "--model", model(), "--prompt", "x", "--n", "0"}), 2, "--n must be in");
  check(rpg({"generate", "--model", model(), "--prompt", std::string(3000, 'a'), "--max-new-tokens", "8"}), 1,
        "exceeds the model context of 512 tokens");
}

}  // namespace
}  // namespace rpg
