// A self-contained HTML report of a run directory: one line chart per metric of
// metrics.jsonl (inline SVG, no scripts or downloads), the resolved config.yaml and the
// last logged sample generations (samples.jsonl). Written atomically to report.html.
#pragma once

#include <filesystem>
#include <string>

namespace rpg::eval {

// Renders the report HTML for `run_dir`. Throws IoError when metrics.jsonl is missing,
// FormatError naming the file and line for a malformed line (a torn last line is skipped).
std::string render_report(const std::filesystem::path& run_dir);

// render_report() written to run_dir/report.html; returns that path.
std::filesystem::path write_report(const std::filesystem::path& run_dir);

}  // namespace rpg::eval
