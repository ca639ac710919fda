// `rpg data prepare`, `rpg data show` and `rpg data synth`: argument parsing only; the work
// is in rpg/data.
#include <iostream>
#include <utility>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/log.h"
#include "rpg/data/dataset.h"
#include "rpg/data/prepare.h"
#include "rpg/data/show.h"
#include "rpg/data/synth.h"

namespace rpg::cli {

namespace {

data::PromptStyle prompt_style_flag(const std::string& full_name, const std::string& value) {
  try {
    return data::parse_prompt_style(value);
  } catch (const ValueError&) {
    throw UsageError(str(full_name, ": --prompt-style: got '", value, "', expected dapo or fewshot"));
  }
}

}  // namespace

int run_data_prepare(const std::string& full_name, const std::vector<std::string>& args) {
  std::string input, output, split, prompt_style = "dapo";
  data::RecordColumns columns;
  data::PrepareOptions options;
  ArgParser parser(full_name,
                   "Turns {problem, answer} records (JSON Lines or CSV with a header) into a Parquet dataset in\n"
                   "the paper's schema: the prompt template applied, one data_source, each problem repeated k\n"
                   "times with extra_info.index 0..k-1 (acc@k). The output is written atomically.");
  parser.positional("INPUT", &input, "records: .jsonl / .json / .ndjson (one object per line) or .csv")
      .positional("OUTPUT", &output, "the Parquet file to write")
      .option("--data-source", &options.data_source, "data_source of every row (selects the reward scorer)", "NAME")
      .option("--repeat", &options.repeat, "repeats per problem (extra_info.index 0..k-1)", "K")
      .option("--problem-key", &columns.problem, "key / column of the problem text (default: problem)", "KEY")
      .option("--answer-key", &columns.answer, "key / column of the answer (default: answer)", "KEY")
      .option("--ability", &options.ability, "ability column (default: MATH)", "TEXT")
      .option("--style", &options.style, "reward_model.style (default: rule-lighteval/MATH_v2)", "TEXT")
      .option("--split", &split, "extra_info.split (default: null)", "TEXT")
      .option("--prompt-style", &prompt_style,
              "dapo (the paper's template, default) or fewshot (a system line and two worked\n"
              "\"Answer: N\" exchanges before the problem, for small instruct models)", "STYLE")
      .epilog("example: rpg data prepare aime25.jsonl aime-2025.parquet --data-source aime2025 --repeat 32");
  if (!parser.parse(args)) return 0;
  if (options.repeat < 1) throw UsageError(str(full_name, ": --repeat: got ", options.repeat, ", expected >= 1"));
  if (options.data_source.empty()) throw UsageError(str(full_name, ": --data-source must not be empty"));
  // Each row is held in memory: a repeat count past this is a typo.
  if (options.repeat > (int64_t{1} << 16))
    throw UsageError(str(full_name, ": --repeat: got ", options.repeat, ", expected at most ", int64_t{1} << 16));
  check_output_apart({"OUTPUT", output}, {{"INPUT", input}});
  if (!split.empty()) options.split = split;
  options.prompt_style = prompt_style_flag(full_name, prompt_style);
  auto records = data::read_records(input, columns);
  auto rows = data::prepare_rows(records, options);
  data::write_parquet(output, rows);
  log_info(str("wrote ", output, ": ", records.size(), " problems x ", options.repeat, " = ", rows.size(), " rows"));
  return 0;
}

int run_data_show(const std::string& full_name, const std::vector<std::string>& args) {
  std::string file;
  int64_t rows = 3, width = 240;
  ArgParser parser(full_name, "Prints a Parquet dataset's schema, its row count and its first rows.");
  parser.positional("FILE", &file, "a Parquet file")
      .option("--rows", &rows, "how many rows to print (default 3)", "N")
      .option("--width", &width, "longest string printed, in bytes (default 240; 0: everything)", "N");
  if (!parser.parse(args)) return 0;
  std::cout << data::show_dataset(file, rows, width);
  return 0;
}

int run_data_synth(const std::string& full_name, const std::vector<std::string>& args) {
  std::string out_dir;
  int64_t seed = 0, min_difficulty = data::kSynthDefaultMinDifficulty, max_difficulty = data::kSynthDefaultMaxDifficulty;
  std::string prompt_style = "dapo";
  data::SynthOptions options;
  data::SynthWriteOptions write;
  ArgParser parser(full_name,
                   "Generates seeded synthetic math problems with exact answers and worked solutions (levels: 0 sums of\n"
                   "three digits (the from-scratch demo's), 1 one operation, 2 several with parentheses, 3 linear equations, 4 digit sums /\n"
                   "products, 5 fractions, 6 a one-digit number added to one below 100 (the real-model demo's)).\n"
                   "Writes train / validation / test .parquet in the paper's schema and <split>_sft.jsonl\n"
                   "(prompt, response) pairs; no problem appears in two splits. Same seed, same bytes.");
  parser.positional("OUT_DIR", &out_dir, "directory for the six files (created when missing)")
      .option("--seed", &seed, "random seed (default 0)", "S")
      .option("--train", &options.train, "training problems (default 2000)", "N")
      .option("--val", &options.validation, "validation problems (default 200)", "N")
      .option("--test", &options.test, "test problems (default 200)", "N")
      .option("--min-difficulty", &min_difficulty, "lowest level, 0..6 (default 1)", "A")
      .option("--max-difficulty", &max_difficulty, "highest level, 0..6 (default 5)", "B")
      .option("--prompt-style", &prompt_style,
              "dapo (the paper's template, default) or fewshot (a system line and two worked\n"
              "\"Answer: N\" exchanges before the problem, for small instruct models)", "STYLE")
      .option("--data-source", &write.data_source, "data_source of every row (default math_dapo)", "NAME")
      .option("--repeat-test", &write.repeat_test, "test rows per problem, extra_info.index 0..k-1 (default 1)", "K")
      .epilog("example: rpg data synth runs/demo/data --seed 1 --train 4000 --max-difficulty 4 --repeat-test 4");
  if (!parser.parse(args)) return 0;
  if (seed < 0) throw UsageError(str(full_name, ": --seed: got ", seed, ", expected >= 0"));
  for (auto [flag, n] : {std::pair{"--train", options.train}, std::pair{"--val", options.validation},
                         std::pair{"--test", options.test}, std::pair{"--repeat-test", write.repeat_test}})
    if (n < 1 || n > (int64_t{1} << 24))
      throw UsageError(str(full_name, ": ", flag, ": got ", n, ", expected 1..", int64_t{1} << 24));
  for (auto [flag, d] : {std::pair{"--min-difficulty", min_difficulty}, std::pair{"--max-difficulty", max_difficulty}})
    if (d < data::kSynthMinDifficulty || d > data::kSynthMaxDifficulty)
      throw UsageError(str(full_name, ": ", flag, ": got ", d, ", expected ", data::kSynthMinDifficulty, "..",
                           data::kSynthMaxDifficulty));
  if (min_difficulty > max_difficulty)
    throw UsageError(str(full_name, ": --min-difficulty ", min_difficulty, " exceeds --max-difficulty ", max_difficulty));
  if (write.data_source.empty()) throw UsageError(str(full_name, ": --data-source must not be empty"));
  write.prompt_style = prompt_style_flag(full_name, prompt_style);
  options.seed = static_cast<uint64_t>(seed);
  options.min_difficulty = static_cast<int>(min_difficulty);
  options.max_difficulty = static_cast<int>(max_difficulty);
  auto splits = data::synth_splits(options);
  data::write_synth(out_dir, splits, write);
  log_info(str("wrote ", out_dir, ": ", splits.train.size(), " train, ", splits.validation.size(), " validation, ",
               splits.test.size(), " test problems (x", write.repeat_test, " test rows), levels ", min_difficulty,
               "..", max_difficulty, ", seed ", seed));
  return 0;
}

}  // namespace rpg::cli
