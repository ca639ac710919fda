#include "rpg/eval/report.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <vector>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/jsonl.h"
#include "rpg/core/text.h"

namespace fs = std::filesystem;

namespace rpg::eval {
namespace {

std::string number(double v) {
  std::ostringstream o;
  o.precision(4);
  o << v;
  return o.str();
}

using Series = std::vector<std::pair<double, double>>;  // (step, value)

// One metric as an SVG line chart with its min / max / last value.
std::string chart(const std::string& name, const Series& points) {
  const double w = 320, h = 140, pad = 8;
  double x0 = points.front().first, x1 = points.front().first, y0 = points.front().second, y1 = y0;
  for (const auto& [x, y] : points) {
    x0 = std::min(x0, x), x1 = std::max(x1, x);
    y0 = std::min(y0, y), y1 = std::max(y1, y);
  }
  const double xs = x1 > x0 ? (w - 2 * pad) / (x1 - x0) : 0, ys = y1 > y0 ? (h - 2 * pad) / (y1 - y0) : 0;
  std::ostringstream svg;
  // data-metric and <title> name the chart for tools and tests (the render test finds the
  // charts by them) and for a hover tooltip in the browser.
  svg << "<figure><figcaption>" << html_escape(name) << " <small>last " << number(points.back().second) << " (min "
      << number(y0) << ", max " << number(y1) << "; steps " << number(x0) << "-" << number(x1)
      << ")</small></figcaption><svg class=\"chart\" data-metric=\"" << html_escape(name) << "\" viewBox=\"0 0 " << w
      << " " << h << "\" width=\"" << w << "\" height=\"" << h << "\"><title>" << html_escape(name) << "</title><rect width=\""
      << w << "\" height=\"" << h << "\" fill=\"#fafafa\" stroke=\"#ddd\"/>";
  if (points.size() == 1) {
    svg << "<circle cx=\"" << w / 2 << "\" cy=\"" << h / 2 << "\" r=\"3\" fill=\"#1f77b4\"/>";
  } else {
    svg << "<polyline fill=\"none\" stroke=\"#1f77b4\" stroke-width=\"1.5\" points=\"";
    for (const auto& [x, y] : points)
      svg << number(pad + (x - x0) * xs) << "," << number(h - pad - (y1 > y0 ? (y - y0) * ys : (h - 2 * pad) / 2))
          << " ";
    svg << "\"/>";
  }
  svg << "</svg></figure>\n";
  return svg.str();
}

}  // namespace

std::vector<nlohmann::json> read_jsonl(const fs::path& path, bool required) {
  if (!fs::exists(path)) {
    if (required) throw IoError(str("no ", path.string(), ": not a run directory"));
    return {};
  }
  return jsonl::read(path);  // a run being written (or killed) may have a torn last line
}

std::string render_report(const fs::path& run_dir) {
  const auto rows = read_jsonl(run_dir / "metrics.jsonl", /*required=*/true);
  std::map<std::string, Series> series;
  for (const auto& r : rows) {
    if (!r.contains("step") || !r["step"].is_number()) continue;
    const double step = r["step"].get<double>();
    for (const auto& [k, v] : r.items())
      if (k != "step" && v.is_number() && std::isfinite(v.get<double>())) series[k].emplace_back(step, v.get<double>());
  }
  std::ostringstream html;
  html << "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>rpg run " << html_escape(run_dir.filename().string())
       << "</title><style>body{font-family:sans-serif;margin:2em}figure{display:inline-block;margin:.5em}"
          "figcaption{font-size:13px}pre{background:#f4f4f4;padding:1em;overflow:auto;max-height:30em}"
          "h2{border-bottom:1px solid #ccc}td{vertical-align:top;padding:.3em;border-bottom:1px solid #eee}"
          "</style></head><body>\n<h1>rpg run: "
       << html_escape(run_dir.string()) << "</h1>\n<p>" << rows.size() << " metric records, "
       << series.size() << " metrics.</p>\n";
  // Validation first (what the paper reports), then the training curves by group.
  for (const std::string group : {"val-core/", "critic/", "acc/", "actor/", "response_length/", "training/", "train/",
                                  "timing_s/", "perf/", "sft/", ""}) {
    std::string charts;
    for (auto it = series.begin(); it != series.end();) {
      if (it->first.rfind(group, 0) == 0) {
        charts += chart(it->first, it->second);
        it = series.erase(it);
      } else {
        ++it;
      }
    }
    if (!charts.empty()) html << "<h2>" << (group.empty() ? "other" : html_escape(group)) << "</h2>\n" << charts;
  }
  const auto samples = read_jsonl(run_dir / "samples.jsonl", /*required=*/false);
  if (!samples.empty()) {
    html << "<h2>sample generations</h2>\n<table>\n<tr><th>step</th><th>prompt</th><th>response</th><th>score</th></tr>\n";
    const size_t start = samples.size() > 20 ? samples.size() - 20 : 0;
    for (size_t i = start; i < samples.size(); ++i) {
      const auto& s = samples[i];
      auto text = [&](const char* key) { return s.contains(key) ? html_escape(s[key].is_string() ? s[key].get<std::string>() : s[key].dump()) : ""; };
      html << "<tr><td>" << text("step") << "</td><td><pre>" << text("prompt") << "</pre></td><td><pre>"
           << text("response") << "</pre></td><td>" << text("score") << "</td></tr>\n";
    }
    html << "</table>\n";
  }
  if (fs::exists(run_dir / "config.yaml"))
    html << "<h2>configuration</h2>\n<pre>" << html_escape(read_file(run_dir / "config.yaml")) << "</pre>\n";
  html << "</body></html>\n";
  return html.str();
}

fs::path write_report(const fs::path& run_dir) {
  const fs::path out = run_dir / "report.html";
  write_file_atomic(out, render_report(run_dir));
  return out;
}

}  // namespace rpg::eval
