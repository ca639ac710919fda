// `rpg eval --responses` against an independent Python computation with verl's own scorer,
// and `rpg train` / `rpg eval` run end to end as subprocesses.
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "rpg/core/io.h"
#include "rpg/core/rng.h"
#include "test_util.h"

namespace rpg {
namespace {

test::ProcessResult rpg_run(std::vector<std::string> args) {
  args.insert(args.begin(), test::rpg_binary().string());
  return test::run_process(args, {"OMP_NUM_THREADS=1"});
}

// A responses file in rpg generate's format: several data sources, problems with 1 to 8
// responses, answers right, wrong, boxed, fractions, missing.
std::string make_responses() {
  RandomStream rs(2024);
  const std::vector<std::string> sources = {"math_dapo", "aime2024", "amc_23"};
  std::string out;
  for (int p = 0; p < 30; ++p) {
    const std::string source = sources[static_cast<size_t>(p) % sources.size()];
    const std::string gt = p % 5 == 0 ? "\\frac{1}{2}" : std::to_string(10 + p);
    const int n = 1 + static_cast<int>(rs.next_u64() % 8);
    for (int i = 0; i < n; ++i) {
      std::string answer;
      switch (rs.next_u64() % 6) {
        case 0: answer = "Answer: " + gt; break;
        case 1: answer = "Answer: " + std::to_string(11 + p); break;
        case 2: answer = "so the result is \\boxed{" + gt + "}"; break;
        case 3: answer = "Answer: $" + gt + "$."; break;
        case 4: answer = "I am not sure."; break;
        default: answer = "Answer: 1/2\nAnswer: " + gt; break;
      }
      nlohmann::json j = {{"prompt_index", p},     {"sample_index", i},
                          {"data_source", source}, {"ground_truth", gt},
                          {"prompt", "Problem " + std::to_string(p)},
                          {"response", "Let me think step by step.\n" + answer}};
      out += j.dump() + "\n";
    }
  }
  return out;
}

TEST(EvalCli, ResponsesFileMatchesPythonWithVerlsScorer) {
  test::TempDir dir;
  test::write_text(dir / "responses.jsonl", make_responses());
  auto r = rpg_run({"eval", "--responses", (dir / "responses.jsonl").string(), "--output", (dir / "m.json").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ours = nlohmann::json::parse(read_file(dir / "m.json"));
  auto ref = nlohmann::json::parse(test::run_oracle("eval_responses.py", {(dir / "responses.jsonl").string()}).out);
  ASSERT_EQ(ours.size(), 3u);
  size_t compared = 0;
  for (const auto& [source, table] : ref.items()) {
    ASSERT_TRUE(ours.contains(source)) << source;
    for (const auto& [name, value] : table.items()) {
      ASSERT_TRUE(ours[source].contains(name)) << source << " " << name;
      EXPECT_NEAR(ours[source][name].get<double>(), value.get<double>(), 1e-9) << source << " " << name;
      ++compared;
    }
  }
  EXPECT_GT(compared, 30u);
  EXPECT_NE(r.out.find("math_dapo/acc/mean@"), std::string::npos) << r.out;
}

TEST(EvalCli, BadResponsesFileIsAOneLineError) {
  test::TempDir dir;
  test::write_text(dir / "bad.jsonl", "{\"data_source\": \"math_dapo\", \"prompt\": \"p\", \"response\": \"x\"}\n");
  auto r = rpg_run({"eval", "--responses", (dir / "bad.jsonl").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("bad.jsonl:1: missing string field 'ground_truth'"), std::string::npos) << r.err;
  test::write_text(dir / "unknown.jsonl",
                   "{\"data_source\": \"nope\", \"prompt\": \"p\", \"response\": \"x\", \"ground_truth\": \"1\"}\n");
  r = rpg_run({"eval", "--responses", (dir / "unknown.jsonl").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("nope"), std::string::npos) << r.err;
  r = rpg_run({"eval", "--data", "x.parquet"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--model DIR is required"), std::string::npos) << r.err;
}

// rpg train on a tiny HF-built chat model, then rpg eval of the model it saved.
TEST(EvalCli, TrainThenEvaluateTheSavedModel) {
  const auto fixture = test::oracle_output_dir("tiny_chat_model.py");
  test::TempDir dir;
  test::write_text(dir / "p.jsonl", "{\"problem\": \"1+1?\", \"answer\": \"2\"}\n{\"problem\": \"2+2?\", \"answer\": \"4\"}\n"
                                    "{\"problem\": \"3+3?\", \"answer\": \"6\"}\n{\"problem\": \"4+4?\", \"answer\": \"8\"}\n");
  const std::string data = (dir / "p.parquet").string();
  ASSERT_EQ(rpg_run({"data", "prepare", (dir / "p.jsonl").string(), data, "--data-source", "math_dapo"}).exit_code, 0);
  const std::string run = (dir / "run").string();
  auto r = rpg_run({"train", "-", "actor_rollout_ref.model.path=" + (fixture / "model").string(),
                    "data.train_files=" + data, "data.val_files=" + data, "data.train_batch_size=2",
                    "data.max_prompt_length=256", "data.max_response_length=8", "actor_rollout_ref.rollout.n=2",
                    "actor_rollout_ref.actor.ppo_mini_batch_size=1", "actor_rollout_ref.actor.policy_loss=rpg_reinforce",
                    "algorithm.adv_estimator=rpg", "trainer.total_training_steps=2", "trainer.test_freq=1",
                    "trainer.default_local_dir=" + run, "trainer.n_gpus_per_node=8", "trainer.sample_log_freq=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("trainer.n_gpus_per_node=8 asks for more processes"), std::string::npos) << r.err;
  auto lines = read_file(std::filesystem::path(run) / "metrics.jsonl");
  EXPECT_NE(lines.find("\"step\":2"), std::string::npos);
  EXPECT_NE(lines.find("actor/pg_loss"), std::string::npos);
  EXPECT_TRUE(std::filesystem::exists(std::filesystem::path(run) / "config.yaml"));
  // The HTML report: a chart per metric (or its line of text when constant over the 2 steps),
  // sample generations, the configuration.
  const std::string report = read_file(std::filesystem::path(run) / "report.html");
  EXPECT_NE(report.find("<b>critic/score/mean</b>"), std::string::npos);
  EXPECT_NE(report.find("<polyline"), std::string::npos);
  EXPECT_NE(report.find("<h3>Newest sample generations</h3>\n<table class=\"samples\">"), std::string::npos);
  EXPECT_NE(report.find("policy_loss: rpg_reinforce"), std::string::npos);
  auto rr = rpg_run({"report", run});
  EXPECT_EQ(rr.exit_code, 0) << rr.err;
  auto bad = rpg_run({"report", (dir / "nothing").string()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("metrics.jsonl: not a run directory"), std::string::npos) << bad.err;
  const std::string saved = run + "/global_step_2/actor";
  ASSERT_TRUE(std::filesystem::exists(saved + "/model.safetensors"));
  ASSERT_TRUE(std::filesystem::exists(saved + "/tokenizer.json"));
  auto e = rpg_run({"eval", "--model", saved, "--data", data, "--n", "2", "--max-new-tokens", "4", "--no-progress",
                    "--output", (dir / "eval.json").string()});
  ASSERT_EQ(e.exit_code, 0) << e.err;
  auto m = nlohmann::json::parse(read_file(dir / "eval.json"));
  EXPECT_EQ(m["math_dapo"]["num_problems"].get<double>(), 4.0);
  EXPECT_EQ(m["math_dapo"]["num_responses"].get<double>(), 8.0);
}

}  // namespace
}  // namespace rpg
