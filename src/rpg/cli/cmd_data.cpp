// `rpg data prepare` and `rpg data show`: argument parsing only; the work is in rpg/data.
#include <iostream>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/core/log.h"
#include "rpg/data/dataset.h"
#include "rpg/data/prepare.h"
#include "rpg/data/show.h"

namespace rpg::cli {

int run_data_prepare(const std::string& full_name, const std::vector<std::string>& args) {
  std::string input, output, split;
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
      .epilog("example: rpg data prepare aime25.jsonl aime-2025.parquet --data-source aime2025 --repeat 32");
  if (!parser.parse(args)) return 0;
  if (options.repeat < 1) throw UsageError(str(full_name, ": --repeat: got ", options.repeat, ", expected >= 1"));
  if (options.data_source.empty()) throw UsageError(str(full_name, ": --data-source must not be empty"));
  if (!split.empty()) options.split = split;
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

}  // namespace rpg::cli
