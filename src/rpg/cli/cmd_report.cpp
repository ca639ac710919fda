// `rpg report`: argument parsing only; the work is in rpg/eval/report.
#include <iostream>

#include "rpg/cli/commands.h"
#include "rpg/core/args.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/log.h"
#include "rpg/eval/report.h"

namespace rpg::cli {

int run_report(const std::string& full_name, const std::vector<std::string>& args) {
  std::vector<std::string> dirs;
  std::string out;
  bool markdown = false;
  ArgParser parser(full_name,
                   "One run: writes RUN_DIR/report.html: a summary (config essentials, held-out accuracy start ->\n"
                   "last / best, step time split, newest generations), then a chart per metric of metrics.jsonl\n"
                   "(x in steps, hover values, EMA smoothing), in one self-contained file.\n"
                   "Several runs: one page (default compare.html) overlaying each metric of every run, with a\n"
                   "table in the layout of the paper's Table 3 (last and best of every held-out mean@n).");
  parser.rest("RUN_DIR", &dirs, "run directories of rpg train / rpg sft (one or more)")
      .option("--out", &out, "the HTML file (default RUN_DIR/report.html for one run, compare.html for several)", "FILE")
      .flag("--markdown", &markdown, "also print the Table 3 layout table as Markdown on stdout")
      .epilog("example: rpg report runs/grpo runs/rpg_reinforce_ufkl --out compare.html --markdown");
  if (!parser.parse(args)) return 0;
  if (dirs.empty()) throw UsageError("report: give at least one RUN_DIR");
  std::vector<std::filesystem::path> paths(dirs.begin(), dirs.end());
  const auto runs = eval::name_runs(paths);
  const std::filesystem::path file =
      !out.empty() ? std::filesystem::path(out) : runs.size() == 1 ? paths[0] / "report.html" : "compare.html";
  // The report is written beside the run's files (RUN_DIR/report.html), never over them.
  std::vector<NamedPath> inputs;
  for (const auto& d : paths)
    for (const char* f : {"metrics.jsonl", "config.yaml", "algorithm.txt"}) inputs.push_back({"the input", d / f});
  check_output_apart({"--out", file}, inputs);
  log_info(str("wrote ", eval::write_report(runs, file).string()));
  if (markdown) std::cout << eval::table3_markdown(runs);
  return 0;
}

}  // namespace rpg::cli
