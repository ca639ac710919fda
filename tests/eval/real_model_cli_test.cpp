// The commands people use on real models, as subprocesses against live oracles:
//  - chat-template kwargs (verl's data.apply_chat_template_kwargs) on the real Qwen3 template
//    (enable_thinking) and through `rpg generate` (tools), equal to
//    transformers.apply_chat_template(..., **kwargs) (tests/oracles/tokenize_jsonl.py);
//  - `rpg tokenize --jsonl` on the real Qwen vocabulary, equal to transformers;
//  - `rpg eval --scored-output`, from a responses file and from a generating eval: every
//    response with the score, acc and prediction verl's math_dapo gives it
//    (tests/oracles/eval_scored.py).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rpg/core/io.h"
#include "test_util.h"

namespace rpg {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

test::ProcessResult rpg_run(std::vector<std::string> args) {
  args.insert(args.begin(), test::rpg_binary().string());
  return test::run_process(args, {"OMP_NUM_THREADS=1"});
}

std::vector<json> json_lines(const std::string& text) {
  std::vector<json> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

// The real Qwen3 tokenizer (151,643 ranks + Qwen3's added tokens and official template).
fs::path qwen3_dir() { return test::oracle_output_dir("tokenizer_real_qwen.py") / "qwen3"; }

// Conversations for the template: single and multi-turn, with a system prompt, with an
// earlier assistant turn carrying reasoning.
std::string conversations_jsonl() {
  std::string out;
  const std::vector<std::string> problems = {"What is 1+1?", "Find x if 2x = 10.", "Übung: 3·4 = ?", "日本語で答えて"};
  for (const auto& p : problems) {
    out += json(p).dump() + "\n";
    out += json{{"messages", json::array({{{"role", "system"}, {"content", "Reason step by step."}},
                                          {{"role", "user"}, {"content", p}}})}}
               .dump() +
           "\n";
    out += json{{"messages", json::array({{{"role", "user"}, {"content", p}},
                                          {{"role", "assistant"}, {"content", "<think>\nhmm\n</think>\n\nNo idea."}},
                                          {{"role", "user"}, {"content", "Try again: " + p}}})}}
               .dump() +
           "\n";
  }
  return out;
}

TEST(ChatTemplateKwargs, Qwen3EnableThinkingMatchesTransformersOnTheRealTemplate) {
  test::TempDir dir;
  const fs::path in = dir / "in.jsonl";
  test::write_text(in, conversations_jsonl());
  std::map<std::string, std::vector<json>> rendered;
  for (std::string kwargs : {"{\"enable_thinking\": false}", "{\"enable_thinking\": true}", ""}) {
    SCOPED_TRACE(kwargs);
    std::vector<std::string> args = {"tokenize", "--model", qwen3_dir().string(), "--chat", "--jsonl", in.string()};
    std::vector<std::string> oargs = {qwen3_dir().string(), in.string(), "--chat"};
    if (!kwargs.empty()) {
      args.insert(args.end(), {"--chat-template-kwargs", kwargs});
      oargs.insert(oargs.end(), {"--chat-template-kwargs", kwargs});
    }
    auto r = rpg_run(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto ours = json_lines(r.out);
    auto ref = json_lines(test::run_oracle("tokenize_jsonl.py", oargs).out);
    ASSERT_EQ(ours.size(), ref.size());
    ASSERT_EQ(ours.size(), 12u);
    for (size_t i = 0; i < ours.size(); ++i) {
      EXPECT_EQ(ours[i]["ids"], ref[i]["ids"]) << i << ": " << ref[i]["text"];
      EXPECT_EQ(ours[i]["num_tokens"], ref[i]["num_tokens"]);
    }
    rendered[kwargs] = ref;
  }
  // What the kwarg does (transformers' rendering): enable_thinking=false appends the empty
  // think block to the generation prompt; true is the default.
  const std::string block = "<think>\n\n</think>\n\n";
  for (size_t i = 0; i < rendered[""].size(); ++i) {
    std::string on = rendered[""][i]["text"], off = rendered["{\"enable_thinking\": false}"][i]["text"];
    EXPECT_EQ(off, on + block) << i;
    EXPECT_EQ(rendered["{\"enable_thinking\": true}"][i]["text"], on) << i;
  }
}

TEST(ChatTemplateKwargs, BadKwargsAreOneLineErrorsNamingTheFlag) {
  test::TempDir dir;
  for (auto [kwargs, needle] : std::vector<std::pair<std::string, std::string>>{
           {"{\"enable_thinking\": fals}", "--chat-template-kwargs: not valid JSON"},
           {"[1, 2]", "--chat-template-kwargs: got [1,2], expected a JSON object"},
           {"{\"add_generation_prompt\": false}", "key 'add_generation_prompt' is a parameter of apply_chat_template"},
           {"{\"tokenize\": true}", "key 'tokenize'"},
           {"{\"messages\": []}", "key 'messages'"}}) {
    SCOPED_TRACE(kwargs);
    for (const char* cmd : {"tokenize", "generate", "eval"}) {
      std::vector<std::string> args = {cmd, "--model", qwen3_dir().string(), "--chat-template-kwargs", kwargs};
      if (std::string(cmd) == "tokenize") args.insert(args.end(), {"--chat", "hi"});
      if (std::string(cmd) == "generate") args.insert(args.end(), {"--prompt", "hi"});
      if (std::string(cmd) == "eval") args.insert(args.end(), {"--data", (dir / "none.parquet").string()});
      auto r = rpg_run(args);
      EXPECT_EQ(r.exit_code, 1) << cmd << ": " << r.err;
      EXPECT_NE(r.err.find("rpg: error: "), std::string::npos) << r.err;
      EXPECT_NE(r.err.find(needle), std::string::npos) << cmd << ": " << r.err;
      EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    }
  }
}

// `rpg generate` renders its prompts with the kwargs: the tiny chat model's Qwen2.5 template
// with tools passed as a kwarg (verl passes **kwargs, so "tools" reaches the template).
TEST(ChatTemplateKwargs, GeneratePromptsEqualTransformersWithKwargs) {
  const fs::path model = test::oracle_output_dir("tiny_chat_model.py") / "model";
  test::TempDir dir;
  const json tools = json::parse(R"([{"type": "function", "function": {"name": "add", "description": "Adds two numbers",
      "parameters": {"type": "object", "properties": {"a": {"type": "number"}}}}}])");
  const std::string kwargs = json{{"tools", tools}, {"custom_variable", 1}}.dump();
  const std::vector<std::string> prompts = {"What is 2+3?", "Say hi."};
  auto r = rpg_run({"generate", "--model", model.string(), "--prompt", prompts[0], "--prompt", prompts[1],
                    "--max-new-tokens", "1", "--temperature", "0", "--no-progress", "--chat-template-kwargs", kwargs,
                    "--output", (dir / "out.jsonl").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ours = json_lines(read_file(dir / "out.jsonl"));
  std::string in;
  for (const auto& p : prompts) in += json(p).dump() + "\n";
  test::write_text(dir / "in.jsonl", in);
  auto ref = json_lines(test::run_oracle("tokenize_jsonl.py", {model.string(), (dir / "in.jsonl").string(), "--chat",
                                                               "--chat-template-kwargs", kwargs})
                            .out);
  ASSERT_EQ(ours.size(), 2u);
  ASSERT_EQ(ref.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(ours[i]["prompt"], ref[i]["text"]) << i;
    EXPECT_NE(ref[i]["text"].get<std::string>().find("Adds two numbers"), std::string::npos);
  }
}

// `rpg train` with verl's data.apply_chat_template_kwargs (YAML mapping via an override):
// the training prompts (samples.jsonl) carry the tools block the kwargs add, exactly as
// transformers renders the same messages with the same kwargs; the resolved config keeps
// the mapping; a reserved key is refused naming the config key.
TEST(ChatTemplateKwargs, TrainRendersPromptsWithDataApplyChatTemplateKwargs) {
  const fs::path model = test::oracle_output_dir("tiny_chat_model.py") / "model";
  test::TempDir dir;
  test::write_text(dir / "p.jsonl", "{\"problem\": \"1+1?\", \"answer\": \"2\"}\n{\"problem\": \"2+2?\", \"answer\": \"4\"}\n");
  const std::string data = (dir / "p.parquet").string();
  ASSERT_EQ(rpg_run({"data", "prepare", (dir / "p.jsonl").string(), data, "--data-source", "math_dapo"}).exit_code, 0);
  const std::string tools =
      R"([{type: function, function: {name: add, description: "Adds two numbers", parameters: {type: object}}}])";
  auto train = [&](const std::string& run, std::vector<std::string> extra) {
    std::vector<std::string> args = {"train", "-", "actor_rollout_ref.model.path=" + model.string(),
                                     "data.train_files=" + data, "data.train_batch_size=2", "data.max_prompt_length=512",
                                     "data.max_response_length=4", "actor_rollout_ref.rollout.n=2",
                                     "actor_rollout_ref.actor.ppo_mini_batch_size=1", "trainer.total_training_steps=1",
                                     "trainer.test_freq=-1", "trainer.default_local_dir=" + run,
                                     "trainer.sample_log_freq=1"};
    args.insert(args.end(), extra.begin(), extra.end());
    return rpg_run(args);
  };
  const std::string run = (dir / "run").string(), plain = (dir / "plain").string();
  auto r = train(run, {"data.apply_chat_template_kwargs.tools=" + tools});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  ASSERT_EQ(train(plain, {}).exit_code, 0);
  auto samples = json_lines(read_file(fs::path(run) / "samples.jsonl"));
  auto plain_samples = json_lines(read_file(fs::path(plain) / "samples.jsonl"));
  ASSERT_FALSE(samples.empty());
  ASSERT_EQ(samples.size(), plain_samples.size());
  // transformers' rendering of the same user message with the same kwargs.
  const std::string user_marker = "<|im_start|>user\n", end_marker = "<|im_end|>";
  std::string in;
  for (const auto& smp : plain_samples) {
    std::string p = smp["prompt"];
    size_t a = p.rfind(user_marker) + user_marker.size();
    in += json{{"messages", json::array({{{"role", "user"}, {"content", p.substr(a, p.find(end_marker, a) - a)}}})}}.dump() + "\n";
  }
  test::write_text(dir / "msgs.jsonl", in);
  const std::string kwargs_json =
      R"({"tools": [{"type": "function", "function": {"name": "add", "description": "Adds two numbers", "parameters": {"type": "object"}}}]})";
  auto ref = json_lines(
      test::run_oracle("tokenize_jsonl.py", {model.string(), (dir / "msgs.jsonl").string(), "--chat-template-kwargs", kwargs_json})
          .out);
  ASSERT_EQ(ref.size(), samples.size());
  for (size_t i = 0; i < samples.size(); ++i) {
    EXPECT_EQ(samples[i]["prompt"], ref[i]["text"]) << i;
    EXPECT_NE(samples[i]["prompt"].get<std::string>().find("Adds two numbers"), std::string::npos);
    EXPECT_EQ(plain_samples[i]["prompt"].get<std::string>().find("Adds two numbers"), std::string::npos);
  }
  EXPECT_NE(read_file(fs::path(run) / "config.yaml").find("apply_chat_template_kwargs:\n    tools:"), std::string::npos);
  auto bad = train((dir / "bad").string(), {"data.apply_chat_template_kwargs.add_generation_prompt=false"});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("data.apply_chat_template_kwargs: key 'add_generation_prompt'"), std::string::npos) << bad.err;
}

// `rpg tokenize --jsonl`: many texts in one process, ids equal to transformers' (the real
// Qwen vocabulary), with and without special tokens; strings and {"text"} objects.
TEST(TokenizeJsonl, ManyTextsEqualTransformersOnTheRealVocabulary) {
  test::TempDir dir;
  std::string in;
  const std::vector<std::string> samples = {"hello world", "  leading spaces", "numbers 1234567 and 3.14159",
                                            "naïve café", "日本語のテキスト", "emoji 😀👍", "<|im_start|>user\nhi<|im_end|>",
                                            "tabs\tand\nnewlines\r\n", "don't won't I'm", "\\frac{1}{2} \\boxed{42}"};
  for (int rep = 0; rep < 30; ++rep)
    for (size_t i = 0; i < samples.size(); ++i) {
      std::string t = samples[i] + (rep ? " #" + std::to_string(rep) : "");
      in += (i % 2 ? json{{"text", t}} : json(t)).dump() + "\n";
    }
  test::write_text(dir / "in.jsonl", in);
  for (bool special : {false, true}) {
    std::vector<std::string> args = {"tokenize", "--model", qwen3_dir().string(), "--jsonl", (dir / "in.jsonl").string()};
    std::vector<std::string> oargs = {qwen3_dir().string(), (dir / "in.jsonl").string()};
    if (special) {
      args.push_back("--add-special-tokens");
      oargs.push_back("--add-special-tokens");
    }
    auto r = rpg_run(args);
    ASSERT_EQ(r.exit_code, 0) << r.err;
    auto ours = json_lines(r.out);
    auto ref = json_lines(test::run_oracle("tokenize_jsonl.py", oargs).out);
    ASSERT_EQ(ours.size(), 300u);
    ASSERT_EQ(ref.size(), 300u);
    for (size_t i = 0; i < ours.size(); ++i) EXPECT_EQ(ours[i]["ids"], ref[i]["ids"]) << ref[i]["text"];
  }
  // Standard input, and bad lines named by file and line.
  test::write_text(dir / "bad.jsonl", "\"ok\"\n{\"txt\": \"no\"}\n");
  auto bad = rpg_run({"tokenize", "--model", qwen3_dir().string(), "--jsonl", (dir / "bad.jsonl").string()});
  EXPECT_EQ(bad.exit_code, 1);
  EXPECT_NE(bad.err.find("bad.jsonl:2: expected a JSON string or an object with \"text\""), std::string::npos) << bad.err;
  auto both = rpg_run({"tokenize", "--model", qwen3_dir().string(), "--jsonl", (dir / "in.jsonl").string(), "hi"});
  EXPECT_EQ(both.exit_code, 2) << both.err;
}

// A responses file with right, wrong, boxed and missing answers.
std::string make_responses() {
  std::string out;
  const std::vector<std::string> sources = {"math_dapo", "aime2024", "amc_23"};
  for (int p = 0; p < 12; ++p) {
    const std::string gt = p % 4 == 0 ? "\\frac{1}{2}" : std::to_string(10 + p);
    for (int i = 0; i < 3; ++i) {
      std::string answer;
      switch ((p + i) % 5) {
        case 0: answer = "Answer: " + gt; break;
        case 1: answer = "Answer: " + std::to_string(11 + p); break;
        case 2: answer = "so the result is \\boxed{" + gt + "}"; break;
        case 3: answer = "I am not sure."; break;
        default: answer = "Answer: $" + gt + "$."; break;
      }
      out += json{{"data_source", sources[static_cast<size_t>(p) % 3]}, {"ground_truth", gt},
                  {"prompt", "Problem " + std::to_string(p)}, {"response", "Step by step.\n" + answer}}
                 .dump() +
             "\n";
    }
  }
  return out;
}

void expect_scored_lines_match_verl(const fs::path& scored) {
  auto ours = json_lines(read_file(scored));
  auto ref = json_lines(test::run_oracle("eval_scored.py", {scored.string()}).out);
  ASSERT_EQ(ours.size(), ref.size());
  ASSERT_FALSE(ours.empty());
  int right = 0;
  for (size_t i = 0; i < ours.size(); ++i) {
    SCOPED_TRACE(ours[i].dump());
    EXPECT_EQ(ours[i]["score"].get<double>(), ref[i]["score"].get<double>());
    EXPECT_EQ(ours[i]["acc"], ref[i]["acc"]);
    EXPECT_EQ(ours[i]["pred"], ref[i]["pred"]);
    for (const char* k : {"data_source", "row", "problem", "ground_truth", "response"}) EXPECT_TRUE(ours[i].contains(k)) << k;
    right += ours[i]["acc"].get<bool>();
  }
  std::printf("[ measure  ] %zu scored responses, %d right\n", ours.size(), right);
}

TEST(ScoredOutput, ResponsesFileEveryResponseScoredAsVerl) {
  test::TempDir dir;
  test::write_text(dir / "responses.jsonl", make_responses());
  auto r = rpg_run({"eval", "--responses", (dir / "responses.jsonl").string(), "--scored-output",
                    (dir / "scored.jsonl").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ours = json_lines(read_file(dir / "scored.jsonl"));
  auto in = json_lines(make_responses());
  ASSERT_EQ(ours.size(), in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(ours[i]["response"], in[i]["response"]);
    EXPECT_EQ(ours[i]["ground_truth"], in[i]["ground_truth"]);
    EXPECT_EQ(ours[i]["data_source"], in[i]["data_source"]);
    EXPECT_EQ(ours[i]["row"], i);
  }
  expect_scored_lines_match_verl(dir / "scored.jsonl");
}

TEST(ScoredOutput, GeneratingEvalWritesEveryResponseScoredAsVerl) {
  const fs::path model = test::oracle_output_dir("tiny_chat_model.py") / "model";
  test::TempDir dir;
  test::write_text(dir / "p.jsonl", "{\"problem\": \"1+1?\", \"answer\": \"2\"}\n{\"problem\": \"2+2?\", \"answer\": \"4\"}\n"
                                    "{\"problem\": \"3+3?\", \"answer\": \"6\"}\n");
  const std::string data = (dir / "p.parquet").string();
  ASSERT_EQ(rpg_run({"data", "prepare", (dir / "p.jsonl").string(), data, "--data-source", "math_dapo"}).exit_code, 0);
  auto r = rpg_run({"eval", "--model", model.string(), "--data", data, "--n", "3", "--max-new-tokens", "6",
                    "--no-progress", "--chat-template-kwargs", "{\"enable_thinking\": false}", "--scored-output",
                    (dir / "scored.jsonl").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto ours = json_lines(read_file(dir / "scored.jsonl"));
  ASSERT_EQ(ours.size(), 9u);
  for (const auto& l : ours) {
    EXPECT_EQ(l["data_source"], "math_dapo");
    EXPECT_GE(l["row"].get<int>(), 0);
    EXPECT_LT(l["row"].get<int>(), 3);
  }
  expect_scored_lines_match_verl(dir / "scored.jsonl");
}

}  // namespace
}  // namespace rpg
