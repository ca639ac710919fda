// A self-contained HTML report of a run directory: one line chart per metric of
// metrics.jsonl (inline SVG, no scripts or downloads), the resolved config.yaml and the
// last logged sample generations (samples.jsonl). Written atomically to report.html.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace rpg::eval {

// The objects of a run's JSON-lines log (metrics.jsonl, samples.jsonl). A missing file is an
// IoError when `required`, else empty; a malformed line is a FormatError naming file and
// line, except a torn last line (a killed run), which is skipped.
std::vector<nlohmann::json> read_jsonl(const std::filesystem::path& path, bool required);

// Renders the report HTML for `run_dir`. Throws IoError when metrics.jsonl is missing,
// FormatError naming the file and line for a malformed line (a torn last line is skipped).
std::string render_report(const std::filesystem::path& run_dir);

// render_report() written to run_dir/report.html; returns that path.
std::filesystem::path write_report(const std::filesystem::path& run_dir);

}  // namespace rpg::eval
