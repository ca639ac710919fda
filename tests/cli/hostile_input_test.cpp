// Hostile and careless input (issue 34): each case runs the real `rpg` under a memory
// limit (ulimit -v) and a time limit (timeout -s KILL), in a directory of its own, and
// checks that the input is refused the way every error is: the exit code, exactly one
// `rpg: error:` line naming the flag / key / file, nothing written or changed in the
// directory, and no runaway (killed by a limit) on the way there.
#include <gtest/gtest.h>

#include <signal.h>

#include <cmath>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>

#include "rpg/core/io.h"
#include "run_fixture.h"

namespace fs = std::filesystem;

namespace rpg {
namespace {

struct Case {
  std::string name;
  // Fills the case's directory (run there). May be empty.
  std::function<void(const fs::path& dir, const fs::path& model)> setup;
  // `rpg` arguments; "{model}" is the tiny chat model, "{dir}" the case's directory.
  std::vector<std::string> args;
  int exit = 1;
  std::string expect;  // part of the one error line
  int timeout_s = 120;
  int memory_mb = 3072;
  std::string warning = "";  // also in stderr when set (e.g. why a damaged checkpoint was skipped)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

std::string quote(const std::string& s) { return "'" + replace_all(s, "'", "'\\''") + "'"; }

// Every file under `dir` with its content: what a refused command must leave as it was.
// Files over 256 MiB (the sparse over-budget cases) by size and modification time.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    const std::string rel = fs::relative(e.path(), dir).string();
    if (!e.is_regular_file()) out[rel] = "<dir>";
    else if (e.file_size() > (std::uintmax_t{256} << 20))
      out[rel] = "<" + std::to_string(e.file_size()) + " bytes, modified " +
                 std::to_string(e.last_write_time().time_since_epoch().count()) + ">";
    else out[rel] = read_file(e.path());
  }
  return out;
}

const fs::path& tiny_model() {
  static const fs::path m = test::oracle_output_dir("tiny_chat_model.py") / "model";
  return m;
}

class HostileInput : public ::testing::TestWithParam<Case> {};

TEST_P(HostileInput, RefusedWithOneLineAndNothingWritten) {
  const Case& c = GetParam();
  test::TempDir dir;
  if (c.setup) c.setup(dir.path(), tiny_model());
  const auto before = snapshot(dir.path());
  std::string script = "cd " + quote(dir.path().string()) + " && ulimit -v " + std::to_string(c.memory_mb * 1024) +
                       " && exec timeout --foreground -s KILL " + std::to_string(c.timeout_s) + " " +
                       quote(test::rpg_binary().string());
  for (const auto& a : c.args)
    script += " " + quote(replace_all(replace_all(a, "{model}", tiny_model().string()), "{dir}", dir.path().string()));
  const auto r = test::run_process({"/bin/sh", "-c", script});
  ASSERT_NE(r.exit_code, 137) << c.name << ": killed by the " << c.timeout_s << " s limit\n" << r.err;
  const auto errors = test::lines_starting(r.err, "rpg: error: ");
  EXPECT_EQ(r.exit_code, c.exit) << c.name << "\n" << r.err;
  ASSERT_EQ(errors.size(), 1u) << c.name << "\n" << r.err;
  EXPECT_NE(errors[0].find(c.expect), std::string::npos) << c.name << ": expected '" << c.expect << "' in\n" << errors[0];
  if (!c.warning.empty()) {
    EXPECT_NE(r.err.find(c.warning), std::string::npos) << c.name << ": expected '" << c.warning << "' in\n" << r.err;
  }
  EXPECT_EQ(errors[0].find("internal:"), std::string::npos) << errors[0];
  EXPECT_EQ(errors[0].find("out of memory"), std::string::npos) << errors[0];
  const auto after = snapshot(dir.path());
  for (const auto& [path, content] : after) {
    auto it = before.find(path);
    EXPECT_TRUE(it != before.end()) << c.name << ": wrote " << path;
    if (it != before.end()) {
      EXPECT_TRUE(it->second == content) << c.name << ": changed " << path;
    }
  }
  for (const auto& [path, content] : before) EXPECT_TRUE(after.count(path)) << c.name << ": removed " << path;
}

// Nine lists of nine aliases of the previous list: 9^9 leaves once expanded.
std::string alias_bomb() {
  std::string s = "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n";
  char prev = 'a';
  for (char c = 'b'; c <= 'i'; ++c) {
    s += std::string(1, c) + ": &" + c + " [";
    for (int k = 0; k < 9; ++k) s += std::string(k ? ", *" : "*") + prev;
    s += "]\n";
    prev = c;
  }
  return s;
}

void write(const fs::path& dir, const std::string& name, const std::string& text) { test::write_text(dir / name, text); }

// The launch cases' address-space limit. `rpg launch` runs in rpg-torch, which maps about
// 500-520 MB before its first check (libtorch, Arrow's bundled jemalloc and mimalloc,
// tcmalloc): at 512 MB the case sat on that edge (Arrow's mimalloc crashed in its exit
// handler at 500 MB with glibc's malloc, at 512 with tcmalloc linked). 768 leaves ~250 MB,
// still short of any per-rank state for 10^8 ranks (400 MB at 4 bytes a rank).
constexpr int kLaunchMemoryMb = 768;

std::vector<Case> cases() {
  std::vector<Case> v;
  // --- counts: launch ---
  for (const char* n : {"100000000", "2147483648", "9223372036854775807"})
    v.push_back({std::string("launch_nproc_") + n, {}, {"launch", "--nproc", n, "--exec", "--", "/bin/true"}, 2,
                 std::string("--nproc ") + n, 30, kLaunchMemoryMb});
  v.push_back({"launch_nproc_huge_forced", {}, {"launch", "--force", "--nproc", "2147483648", "--exec", "--", "/bin/true"},
               2, "at most 2147483647", 30, kLaunchMemoryMb});
  for (const char* n : {"0", "-1", "-9223372036854775808"})
    v.push_back({std::string("launch_nproc_") + (n[0] == '-' ? std::string("minus") + (n + 1) : n), {},
                 {"launch", "--nproc", n, "--", "version"}, 2, std::string("--nproc must be >= 1, got ") + n, 30, kLaunchMemoryMb});
  v.push_back({"launch_nnodes_overflow", {}, {"launch", "--nnodes", "4294967297", "--master-port", "1", "--", "version"},
               2, "--nnodes", 30, kLaunchMemoryMb});
  v.push_back({"launch_node_rank_negative", {}, {"launch", "--node-rank", "-1", "--", "version"}, 2, "--node-rank -1",
               30, kLaunchMemoryMb});
  v.push_back({"launch_exec_not_in_path", {}, {"launch", "--exec", "--", "no-such-program-rpg34"}, 1,
               "'no-such-program-rpg34'", 30, kLaunchMemoryMb});
  // --- YAML ---
  v.push_back({"yaml_alias_bomb_config_show", [](auto& d, auto&) { write(d, "bomb.yaml", alias_bomb()); },
               {"config", "show", "bomb.yaml"}, 1, "bomb.yaml: expands to more than", 60, 1024});
  v.push_back({"yaml_alias_bomb_train", [](auto& d, auto&) { write(d, "bomb.yaml", alias_bomb()); },
               {"train", "bomb.yaml"}, 1, "bomb.yaml: expands to more than", 60, 1024});
  v.push_back({"yaml_alias_bomb_override", {}, {"config", "show", "-", "trainer.x=[&a [1,1,1,1,1,1,1,1,1,1], "
               "&b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b], "
               "&d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d], "
               "&f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e], [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]]"},
               1, "expands to more than", 60, 1024});
  v.push_back({"yaml_deep_nesting", [](auto& d, auto&) { write(d, "deep.yaml", "a: " + std::string(200, '[') +
                                                                          std::string(200, ']') + "\n"); },
               {"config", "show", "deep.yaml"}, 1, "deep.yaml:1:", 60, 1024});
  // --- counts: generate / model init ---
  for (const char* n : {"0", "-1", "300000000", "2147483648", "9223372036854775807"})
    v.push_back({std::string("generate_n_") + (n[0] == '-' ? "minus1" : n), {},
                 {"generate", "--model", "{model}", "--prompt", "hi", "--n", n}, 2, std::string("--n must be in"), 60,
                 2048});
  v.push_back({"generate_n_times_tokens_beyond_memory", {},
               {"generate", "--model", "{model}", "--prompt", "hi", "--n", "1048576", "--max-new-tokens", "16777216"}, 1,
               "of memory available", 60, 2048});
  for (const auto& [flag, value] : std::vector<std::pair<std::string, std::string>>{
           {"--max-num-seqs", "0"}, {"--max-new-tokens", "0"}, {"--top-k", "0"}, {"--top-k", "-2"},
           {"--max-kv-tokens", "-1"}, {"--top-p", "0"}, {"--temperature", "-1"}, {"--max-num-seqs", "9223372036854775807"},
           {"--kv-cache-memory-fraction", "2"}, {"--kv-cache-memory-fraction", "-1"},
           {"--max-num-batched-tokens", "0"}, {"--max-num-batched-tokens", "-1"}})
    v.push_back({"generate_" + flag.substr(2) + "_" + (value[0] == '-' ? "minus" + value.substr(1) : value), {},
                 {"generate", "--model", "{model}", "--prompt", "hi", flag, value}, 2, "rpg generate: " + flag, 60, 2048});
  // A KV-cache share of the memory too small for one sequence: refused before the first step.
  v.push_back({"generate_kv_cache_memory_fraction_below_one_sequence", {},
               {"generate", "--model", "{model}", "--prompt", "hi", "--max-new-tokens", "8", "--kv-cache-memory-fraction",
                "0.000000001"}, 1,
               "of the available memory: ", 60, 2048});
  v.push_back({"model_init_beyond_memory", {},
               {"model", "init", "--tokenizer", "{model}", "--output", "m", "--hidden", "65536", "--intermediate",
                "1048576"}, 1, "of memory available", 60, 2048});
  // A JSONL line over the 64 MiB budget of one JSON line (its DOM would take ~10x).
  v.push_back({"data_prepare_jsonl_line_over_budget",
               [](auto& d, auto&) {
                 write(d, "p.jsonl", "{\"problem\": \"" + std::string((size_t{64} << 20) + 1, 'x') + "\", \"answer\": \"2\"}\n");
               },
               {"data", "prepare", "p.jsonl", "o.parquet"}, 1, "p.jsonl:1: a line of 67108895 bytes is over the 64 MiB "
               "budget of one JSON line", 60, 1024});
  // Whole-file budgets of the JSON files parsed into memory: checked from the size (the
  // files here are sparse: nothing is read or allocated).
  for (const auto& [file, budget] : std::vector<std::pair<std::string, std::string>>{
           {"tokenizer.json", "512 MiB"}, {"config.json", "16 MiB"}, {"tokenizer_config.json", "64 MiB"}})
    v.push_back({"json_file_over_budget_" + file,
                 [file](const fs::path& d, const fs::path& m) {
                   fs::copy(m, d / "model", fs::copy_options::recursive);
                   fs::resize_file(d / "model" / file, std::uintmax_t{1} << 30);
                 },
                 {"generate", "--model", "model", "--prompt", "hi"}, 1,
                 "model/" + file + ": 1073741824 bytes is over the " + budget + " budget of a " + file, 60, 1024});
  v.push_back({"json_file_without_end_config_json",  // a stream with no size: bounded by bytes read
               [](const fs::path& d, const fs::path& m) {
                 fs::copy(m, d / "model", fs::copy_options::recursive);
                 fs::remove(d / "model" / "config.json");
                 fs::create_symlink("/dev/zero", d / "model" / "config.json");
               },
               {"generate", "--model", "model", "--prompt", "hi"}, 1,
               "model/config.json: more than 16777216 bytes is over the 16 MiB budget of a config.json", 60, 1024});
  // Model files cut short at their structural boundaries, through the real CLI: the
  // safetensors length prefix, its JSON header, the header's end, the tensor data; config.json,
  // tokenizer.json and tokenizer_config.json mid-document. Each is one line naming the file.
  auto cut = [](std::string file, std::function<size_t(const fs::path&)> at) {
    return [file, at](const fs::path& d, const fs::path& m) {
      fs::copy(m, d / "model", fs::copy_options::recursive);
      fs::resize_file(d / "model" / file, at(d / "model" / file));
    };
  };
  auto st_header = [](const fs::path& f) {  // the safetensors header's byte length (little-endian u64)
    const std::string b = read_file(f).substr(0, 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = n << 8 | static_cast<unsigned char>(b[static_cast<size_t>(i)]);
    return static_cast<size_t>(n);
  };
  const std::vector<std::pair<std::string, std::function<size_t(const fs::path&)>>> st_cuts = {
      {"empty", [](const fs::path&) { return size_t{0}; }},
      {"in_length_prefix", [](const fs::path&) { return size_t{5}; }},
      {"in_header", [st_header](const fs::path& f) { return 8 + st_header(f) / 2; }},
      {"after_header", [st_header](const fs::path& f) { return 8 + st_header(f); }},
      {"in_tensor_data", [](const fs::path& f) { return static_cast<size_t>(fs::file_size(f) / 2); }},
      {"last_byte", [](const fs::path& f) { return static_cast<size_t>(fs::file_size(f) - 1); }}};
  for (const auto& [where, at] : st_cuts)
    v.push_back({"model_safetensors_cut_" + where, cut("model.safetensors", at),
                 {"generate", "--model", "model", "--prompt", "hi"}, 1, "model/model.safetensors"});
  for (const char* file : {"config.json", "tokenizer.json", "tokenizer_config.json"})
    for (const auto& [where, frac] : std::vector<std::pair<std::string, double>>{{"first_byte", 0.0}, {"middle", 0.5},
                                                                                {"last_byte", 1.0}}) {
      std::string name = file;
      name = name.substr(0, name.find('.'));
      v.push_back({name + "_cut_at_" + where,
                   cut(file, [frac](const fs::path& f) {
                     const auto n = static_cast<size_t>(fs::file_size(f));
                     return frac == 0.0 ? size_t{1} : frac == 1.0 ? n - 2 : static_cast<size_t>(static_cast<double>(n) * frac);
                   }),
                   {"generate", "--model", "model", "--prompt", "hi"}, 1, std::string("model/") + file});
    }
  // A records file larger than the memory (sparse: nothing read).
  v.push_back({"data_prepare_file_beyond_memory",
               [](const fs::path& d, const fs::path&) {
                 write(d, "p.jsonl", "{\"problem\": \"1+1?\", \"answer\": \"2\"}\n");
                 fs::resize_file(d / "p.jsonl", std::uintmax_t{1} << 40);
               },
               {"data", "prepare", "p.jsonl", "o.parquet"}, 1, "p.jsonl: 1024 GiB read whole needs about", 60, 1024});
  v.push_back({"data_prepare_repeat_huge", [](auto& d, auto&) { write(d, "p.jsonl", "{\"problem\": \"1+1?\", \"answer\": \"2\"}\n"); },
               {"data", "prepare", "p.jsonl", "o.parquet", "--repeat", "2147483648"}, 2, "--repeat", 60, 1024});
  v.push_back({"data_synth_train_huge", {}, {"data", "synth", "out", "--train", "9223372036854775807"}, 2, "--train",
               60, 1024});
  // --- an output over its own input ---
  auto with_model = [](const fs::path& d, const fs::path& m) {
    fs::copy(m, d / "model", fs::copy_options::recursive);
    write(d, "sft.jsonl", "{\"prompt\": \"a\", \"response\": \"b\"}\n");
    write(d, "p.jsonl", "{\"problem\": \"1+1?\", \"answer\": \"2\"}\n");
    write(d, "corpus.txt", "hello world\n");
    write(d, "run/metrics.jsonl", "{\"step\": 1}\n");
  };
  v.push_back({"sft_output_contains_model", with_model, {"sft", "--model", "model", "--data", "sft.jsonl", "--output", "."},
               1, "--output . contains --model model"});
  v.push_back({"sft_output_is_model", with_model,
               {"sft", "--model", "model", "--data", "sft.jsonl", "--output", "model/../model"}, 1, "is the same path as"});
  v.push_back({"sft_output_contains_data", with_model,
               {"sft", "--model", "{model}", "--data", "sft.jsonl", "--output", "{dir}"}, 1, "contains --data sft.jsonl"});
  v.push_back({"train_run_dir_contains_model", with_model,
               {"train", "-", "actor_rollout_ref.model.path=model", "trainer.default_local_dir=."}, 1,
               "trainer.default_local_dir . contains actor_rollout_ref.model.path model"});
  v.push_back({"train_run_dir_inside_model", with_model,
               {"train", "-", "actor_rollout_ref.model.path=model", "trainer.default_local_dir=model/run"}, 1,
               "lies inside actor_rollout_ref.model.path"});
  v.push_back({"data_prepare_output_is_input", with_model, {"data", "prepare", "p.jsonl", "./p.jsonl"}, 1,
               "OUTPUT ./p.jsonl is the same path as INPUT p.jsonl"});
  v.push_back({"model_init_output_is_tokenizer", with_model, {"model", "init", "--tokenizer", "model", "--output", "model"},
               1, "--output model is the same path as --tokenizer model"});
  v.push_back({"tokenizer_train_output_contains_corpus", with_model,
               {"tokenizer", "train", "--corpus", "corpus.txt", "--output", "."}, 1, "contains --corpus corpus.txt"});
  v.push_back({"generate_output_over_model", with_model,
               {"generate", "--model", "model", "--prompt", "hi", "--output", "model/x.jsonl"}, 1,
               "lies inside --model model"});
  v.push_back({"eval_output_over_responses", with_model,
               {"eval", "--responses", "p.jsonl", "--output", "p.jsonl"}, 1, "is the same path as --responses"});
  v.push_back({"report_out_over_metrics", with_model, {"report", "run", "--out", "run/metrics.jsonl"}, 1,
               "is the same path as the input run/metrics.jsonl"});
  // --- tokenizer.json: one id for two tokens ---
  auto tokenizer_edit = [](const char* what) {
    return [what](const fs::path& d, const fs::path& m) {
      fs::copy(m, d / "model", fs::copy_options::recursive);
      auto j = nlohmann::json::parse(read_file(d / "model" / "tokenizer.json"));
      auto& vocab = j["model"]["vocab"];
      const int64_t a = vocab["a"].get<int64_t>();
      if (std::string(what) == "vocab") vocab["zz_dup"] = a;
      else j["added_tokens"].push_back({{"id", a}, {"content", "<|evil|>"}, {"special", true}, {"normalized", false}});
      write(d, "model/tokenizer.json", j.dump());
    };
  };
  v.push_back({"tokenizer_two_vocab_tokens_one_id", tokenizer_edit("vocab"), {"tokenize", "--model", "model", "hi"}, 1,
               "model.vocab[\"zz_dup\"]: id"});
  v.push_back({"tokenizer_added_token_over_vocab_id", tokenizer_edit("added"), {"tokenize", "--model", "model", "hi"}, 1,
               "is already the token \"a\""});
  v.push_back({"generate_with_added_token_over_vocab_id", tokenizer_edit("added"),
               {"generate", "--model", "model", "--prompt", "hi", "--max-new-tokens", "2"}, 1, "is already the token"});
  // --- empty data: a file without rows, a row without a message; a training temperature of 0 ---
  auto with_data = [](const fs::path& d, const fs::path& m) {
    fs::copy(m, d / "model", fs::copy_options::recursive);
    write(d, "p.jsonl", "{\"problem\": \"1+1?\", \"answer\": \"2\"}\n");
    auto prep = test::run_process({test::rpg_binary().string(), "data", "prepare", (d / "p.jsonl").string(),
                                   (d / "p.parquet").string(), "--data-source", "math_dapo"});
    ASSERT_EQ(prep.exit_code, 0) << prep.err;
    // The same schema with no rows, and the row with an empty message list.
    test::edit_parquet(d, "empty.parquet", "out = t.slice(0, 0)");
    test::edit_parquet(d, "noprompt.parquet",
                       "out = t.set_column(i, 'prompt', pa.array([[]] * t.num_rows, type=t.schema.field(i).type))");
  };
  const std::vector<std::string> train = {"train", "-", "actor_rollout_ref.model.path=model", "data.train_batch_size=1",
                                          "actor_rollout_ref.actor.ppo_mini_batch_size=1", "data.max_response_length=4",
                                          "trainer.default_local_dir=run"};
  auto train_with = [&](std::vector<std::string> more) {
    std::vector<std::string> a = train;
    a.insert(a.end(), more.begin(), more.end());
    return a;
  };
  v.push_back({"eval_zero_row_data", with_data, {"eval", "--model", "model", "--data", "empty.parquet"}, 1,
               "--data empty.parquet: no rows"});
  v.push_back({"generate_prompt_without_message", with_data, {"generate", "--model", "model", "--data", "noprompt.parquet"},
               1, "noprompt.parquet: row 0: the prompt holds no message"});
  v.push_back({"train_zero_row_val_file", with_data,
               train_with({"data.train_files=p.parquet", "data.val_files=[empty.parquet]"}), 1,
               "data.val_files empty.parquet: no rows"});
  v.push_back({"train_zero_row_train_file", with_data, train_with({"data.train_files=[p.parquet,empty.parquet]"}), 1,
               "data.train_files empty.parquet: no rows"});
  v.push_back({"train_prompt_without_message", with_data, train_with({"data.train_files=noprompt.parquet"}), 1,
               "noprompt.parquet: row 0: the prompt holds no message"});
  // A 70 MB prompt exceeds the chat template's 64 MiB output budget: the error names the
  // data file and row, not only the template.
  v.push_back({"train_prompt_beyond_template_budget",
               [with_data](const fs::path& d, const fs::path& m) {
                 with_data(d, m);
                 test::edit_parquet(d, "big.parquet",
                                    "big = [[{'content': 'x' * (70 << 20), 'role': 'user'}]] * t.num_rows\n"
                                    "out = t.set_column(i, 'prompt', pa.array(big, type=t.schema.field(i).type))");
               },
               train_with({"data.train_files=big.parquet"}), 1,
               "data.train_files: big.parquet row 0: rendering its prompt with the chat template failed"});
  v.push_back({"train_temperature_zero", with_data,
               train_with({"data.train_files=p.parquet", "actor_rollout_ref.rollout.temperature=0"}), 1,
               "actor_rollout_ref.rollout.temperature: must be > 0 for training"});
  // --- a checkpoint's train_state.json edited: resumed state is checked as a whole ---
  // Sets train_state.json's `key` (or key.sub) to `value`.
  auto edited_run = [with_data, train](const char* key, double value, const char* sub = nullptr) {
    return [with_data, train, key, value, sub](const fs::path& d, const fs::path& m) {
      with_data(d, m);
      // Run in the case's directory: the relative paths are those the refused command uses.
      std::string script = "cd " + quote(d.string()) + " && exec " + quote(test::rpg_binary().string());
      for (const auto& a : train) script += " " + quote(a);
      for (const char* a : {"data.train_files=p.parquet", "trainer.total_training_steps=2", "trainer.save_freq=1",
                            "trainer.max_actor_ckpt_to_keep=1"})
        script += " " + quote(a);
      auto r = test::run_process({"/bin/sh", "-c", script}, {"OMP_NUM_THREADS=1"});
      ASSERT_EQ(r.exit_code, 0) << r.err;
      const fs::path f = d / "run" / "global_step_2" / "train_state.json";
      auto j = nlohmann::json::parse(read_file(f));
      auto& field = sub ? j[key][sub] : j[key];
      if (value == std::floor(value)) field = static_cast<int64_t>(value);
      else field = value;
      write_file_atomic(f, j.dump());
    };
  };
  const auto resume = train_with({"data.train_files=p.parquet", "trainer.total_training_steps=2"});
  v.push_back({"resume_step_negative", edited_run("step", -1), resume, 1, "no intact checkpoint in run"});
  // A step that disagrees with its directory (global_step_2) is damage; a checkpoint at a
  // step the config no longer plans is refused as such.
  v.push_back({"resume_step_edited", edited_run("step", 5), resume, 1, "no intact checkpoint in run"});
  v.push_back({"resume_step_huge", edited_run("step", 1000000000000), resume, 1, "no intact checkpoint in run"});
  v.push_back({"resume_beyond_the_plan", edited_run("step", 2),
               train_with({"data.train_files=p.parquet", "trainer.total_training_steps=1"}), 1,
               "it is at step 2, beyond the 1 steps this config plans"});
  v.push_back({"resume_cursor_huge", edited_run("cursor", 1000000000), resume, 1, "no intact checkpoint in run"});
  v.push_back({"resume_epoch_negative", edited_run("epoch", -3), resume, 1, "no intact checkpoint in run"});
  // The optimizer's step count (Adam's bias correction) beyond what 2 training steps take,
  // negative, or fractional.
  for (const auto& [name, value] : std::vector<std::pair<std::string, double>>{
           {"resume_optimizer_step_huge", 1e12}, {"resume_optimizer_step_negative", -4}, {"resume_optimizer_step_fractional", 2.5}}) {
    Case c{name, edited_run("optimizer", value, "step"), resume, 1, "no intact checkpoint in run"};
    c.warning = "the optimizer's step count";
    v.push_back(c);
  }
  // --- config.json asking for a million layers the files do not hold ---
  v.push_back({"generate_config_million_layers",
               [](const fs::path& d, const fs::path& m) {
                 fs::copy(m, d / "model", fs::copy_options::recursive);
                 auto j = nlohmann::json::parse(read_file(d / "model" / "config.json"));
                 j["num_hidden_layers"] = 1000000;
                 write(d, "model/config.json", j.dump());
               },
               {"generate", "--model", "model", "--prompt", "hi"}, 1,
               "config.json: num_hidden_layers is 1000000, but the checkpoint holds only", 20, 1024});
  // --- a model whose weights are NaN ---
  auto nan_model = [](const fs::path& d, const fs::path& m) {
    fs::copy(m, d / "model", fs::copy_options::recursive);
    auto py = test::run_process(
        {test::python().string(), "-c",
         "import sys, torch\nfrom safetensors.torch import load_file, save_file\n"
         "p = sys.argv[1]; t = load_file(p)\n"
         "save_file({k: torch.full_like(v, float('nan')) for k, v in t.items()}, p, metadata={'format': 'pt'})\n",
         (d / "model" / "model.safetensors").string()});
    ASSERT_EQ(py.exit_code, 0) << py.err;
  };
  v.push_back({"generate_nan_weights", nan_model, {"generate", "--model", "model", "--prompt", "hi"}, 1,
               "holds NaN or Inf values"});
  v.push_back({"train_nan_weights", nan_model,
               {"train", "-", "actor_rollout_ref.model.path=model", "trainer.default_local_dir=run"}, 1,
               "holds NaN or Inf values"});
  // --- rpg plan on a model directory without weights ---
  auto index_only = [](const fs::path& d, const fs::path& m) {
    fs::create_directories(d / "m");
    fs::copy_file(m / "config.json", d / "m" / "config.json");
    write(d, "m/model.safetensors.index.json", "{\"metadata\": {}, \"weight_map\": {}}");
  };
  v.push_back({"plan_index_without_tensors", index_only, {"plan", "-", "actor_rollout_ref.model.path=m"}, 1,
               "m/model.safetensors.index.json: the index lists no tensors"});
  auto index_missing_shard = [](const fs::path& d, const fs::path& m) {
    fs::create_directories(d / "m");
    fs::copy_file(m / "config.json", d / "m" / "config.json");
    write(d, "m/model.safetensors.index.json",
          "{\"weight_map\": {\"model.embed_tokens.weight\": \"model-00001-of-00002.safetensors\"}}");
  };
  v.push_back({"plan_index_shard_missing", index_missing_shard, {"plan", "-", "actor_rollout_ref.model.path=m"}, 1,
               "model-00001-of-00002.safetensors: cannot open"});
  return v;
}

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string name = info.param.name;
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return name;
}

INSTANTIATE_TEST_SUITE_P(Issue34, HostileInput, ::testing::ValuesIn(cases()), case_name);

// A stop signal while the ranks are still being started ends the start: the started
// ranks are killed and reaped, the launch fails, nothing is left running.
TEST(HostileLaunch, SigtermWhileSpawningStopsAndReaps) {
  test::TempDir dir;
  const fs::path marker = dir / "started";
  // Each rank appends its pid, then sleeps: more ranks than can start before the signal.
  const std::string script = "cd " + quote(dir.path().string()) + " || exit 99; timeout --foreground -s KILL 120 " +
                             quote(test::rpg_binary().string()) +
                             " launch --force --nproc 100000 --exec -- /bin/sh -c 'echo $$ >> started; exec sleep 300' "
                             "& pid=$!; while [ ! -s started ]; do sleep 0.1; done; kill -TERM $pid; wait $pid";
  const auto r = test::run_process({"/bin/sh", "-c", script});
  ASSERT_NE(r.exit_code, 137) << "the launch ignored SIGTERM\n" << r.err;
  EXPECT_EQ(r.exit_code, 1) << r.err;
  const auto errors = test::lines_starting(r.err, "rpg: error: ");
  ASSERT_EQ(errors.size(), 1u) << r.err;
  EXPECT_NE(errors[0].find("interrupted by SIGTERM while starting rank"), std::string::npos) << errors[0];
  // Reaped: the launcher returned only after waiting for every rank it started, so none
  // of their pids is alive (not even as a zombie: it would still answer kill 0).
  std::istringstream pids(read_file(marker));
  int pid = 0, alive = 0, n = 0;
  while (pids >> pid) ++n, alive += ::kill(pid, 0) == 0;
  EXPECT_GT(n, 0);
  EXPECT_EQ(alive, 0) << alive << " of " << n << " started ranks are still there";
}

}  // namespace
}  // namespace rpg
