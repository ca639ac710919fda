// The run report: one self-contained HTML file (inline SVG, a few lines of plain script, no
// downloads) that says first how a run went (config essentials, held-out accuracy start ->
// last / best, where a step's time goes, the newest generations) and then charts every
// metric of metrics.jsonl with axes in training steps, nearest-point values and optional
// EMA smoothing; constant series are one line of text. Several runs give one page that
// overlays each metric of every run and a table in the layout of the paper's Table 3.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace rpg::eval {

// The objects of a run's JSON-lines log (metrics.jsonl, samples.jsonl). A missing file is an
// IoError when `required`, else empty; a malformed line is a FormatError naming file and
// line, except a torn last line (a killed run), which is skipped.
std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path, bool required);

// A run directory and the name it goes by in legends and tables.
struct RunInput {
  std::string name;
  std::filesystem::path dir;
};

// Names for run directories: the shortest trailing path parts that tell them apart
// ("grpo", or "seed_1/grpo" beside "seed_2/grpo").
std::vector<RunInput> name_runs(const std::vector<std::filesystem::path>& dirs);

// The report HTML of one run (its summary and charts) or of several (runs table, Table 3,
// overlaid charts). Throws IoError when a metrics.jsonl is missing, FormatError naming the
// file and line for a malformed line (a torn last line is skipped).
std::string render_report(const std::vector<RunInput>& runs);
std::string render_report(const std::filesystem::path& run_dir);

// The paper's Table 3 layout as Markdown: one row per run; for every headline validation
// metric (val-core/<source>/.../mean@n) its Start (first value), Last, and Best (highest
// after step 0, with its step).
std::string table3_markdown(const std::vector<RunInput>& runs);

// render_report() written atomically to `out`; returns `out`.
std::filesystem::path write_report(const std::vector<RunInput>& runs, const std::filesystem::path& out);
// One run's report written to run_dir/report.html; returns that path.
std::filesystem::path write_report(const std::filesystem::path& run_dir);

}  // namespace rpg::eval
