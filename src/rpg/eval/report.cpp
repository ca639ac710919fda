#include "rpg/eval/report.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/text.h"
#include "rpg/eval/chart.h"
#include "rpg/eval/report_run.h"

namespace fs = std::filesystem;

namespace rpg::eval {
namespace {

using namespace report_detail;  // NOLINT: the report's own run model

constexpr double kDefaultSmoothing = 0.6;  // TensorBoard's default slider position

std::string fixed(double v, int digits) {
  if (!std::isfinite(v)) return format_number(v);
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, v);
  return buf;
}

std::string esc(const std::string& s) { return html_escape(s); }

// A step as a whole number (12345, not the 4 significant digits of a value: 1.234e+04).
std::string format_step(double step) {
  if (step != std::floor(step) || std::fabs(step) >= 1e15) return format_number(step);
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.0f", step);
  return buf;
}

// ---- what the summary shows ------------------------------------------------------------

std::string short_metric(const std::string& m) { return m.rfind("val-core/", 0) == 0 ? m.substr(9) : m; }

std::string runs_table(const std::vector<Run>& runs) {
  std::ostringstream h;
  h << "<table class=\"runs\"><tr><th>run</th><th>model</th><th>algorithm</th><th>lr</th>"
       "<th>batch x n</th><th>steps done / planned</th><th>s / step</th></tr>\n";
  for (const auto& r : runs) {
    const double done = r.last_step();
    const std::string planned = cfg(r, "trainer.total_training_steps");
    const std::string batch = cfg(r, "data.train_batch_size"), n = cfg(r, "actor_rollout_ref.rollout.n");
    const std::string lr = cfg(r, "actor_rollout_ref.actor.optim.lr"), opt = cfg(r, "actor_rollout_ref.actor.optim.optim_type");
    h << "<tr><td>" << esc(r.name) << "</td><td>" << esc(cfg(r, "actor_rollout_ref.model.path")) << "</td><td>"
      << esc(algorithm_description(r)) << "</td><td>" << esc(lr) << (opt.empty() ? "" : " (" + esc(opt) + ")") << "</td><td>"
      << (batch.empty() ? "" : esc(batch + " x " + n)) << "</td><td>" << (std::isfinite(done) ? format_step(done) : "none")
      << " / " << (planned.empty() ? "?" : esc(planned)) << "</td><td>" << fixed(mean_of(r, "timing_s/step"), 2)
      << "</td></tr>\n";
  }
  h << "</table>\n";
  for (const auto& r : runs) {
    if (!r.config && r.config_error.empty())
      h << "<p class=\"note\">" << esc(r.name) << ": no config.yaml in the run directory, so no configuration to show.</p>\n";
    if (!r.config_error.empty()) h << "<p class=\"note\">" << esc(r.name) << ": config.yaml unreadable: " << esc(r.config_error) << "</p>\n";
  }
  return h.str();
}

std::string cell(double v, double step, bool with_step) {
  if (std::isnan(v)) return "–";
  return fixed(v, 4) + (with_step ? str(" (", format_step(step), ")") : "");
}

// Table 3: one row per run, for each headline metric Start, Last and Best (step).
std::string table3_html(const std::vector<Run>& runs, const std::vector<std::string>& metrics) {
  std::ostringstream h;
  h << "<table class=\"table3\"><tr><th rowspan=\"2\">run</th>";
  for (const auto& m : metrics) h << "<th colspan=\"3\">" << esc(short_metric(m)) << "</th>";
  h << "</tr>\n<tr>";
  for (size_t i = 0; i < metrics.size(); ++i) h << "<th>start</th><th>last</th><th>best (step)</th>";
  h << "</tr>\n";
  for (const auto& r : runs) {
    h << "<tr><td>" << esc(r.name) << "</td>";
    for (const auto& m : metrics) {
      const Held x = held_out(r, m);
      h << "<td data-run=\"" << esc(r.name) << "\" data-metric=\"" << esc(m) << "\" data-col=\"start\">"
        << cell(x.start, x.start_step, false) << "</td><td data-run=\"" << esc(r.name) << "\" data-metric=\"" << esc(m)
        << "\" data-col=\"last\">" << cell(x.last, x.last_step, false) << "</td><td data-run=\"" << esc(r.name)
        << "\" data-metric=\"" << esc(m) << "\" data-col=\"best\">" << cell(x.best, x.best_step, true) << "</td>";
    }
    h << "</tr>\n";
  }
  h << "</table>\n<p class=\"note\">Start: the first validation; last: the newest; best: the highest after step 0, with "
       "its step (as the paper's Table 3 reports last and best).</p>\n";
  return h.str();
}

// Every validation statistic a run logged (val-core/ and val-aux/: mean, std, best@k, maj@k,
// pass@k, ...), one row per metric, for each run its last and best value (with the step of
// the best): the headline table keeps the paper's layout, this one leaves nothing out.
std::vector<std::string> validation_metrics(const std::vector<Run>& runs) {
  std::set<std::string> names;
  for (const auto& r : runs) {
    for (const auto& [k, v] : r.values)
      if (is_validation(k)) names.insert(k);
    for (const auto& [k, v] : r.nonfinite)
      if (is_validation(k)) names.insert(k);
  }
  return {names.begin(), names.end()};
}

std::string all_validation_html(const std::vector<Run>& runs, const std::vector<std::string>& metrics) {
  std::ostringstream h;
  h << "<details><summary>Every validation metric: last and best (step) per run</summary>\n"
       "<table class=\"allval\"><tr><th rowspan=\"2\">metric</th>";
  for (const auto& r : runs) h << "<th colspan=\"2\">" << esc(r.name) << "</th>";
  h << "</tr>\n<tr>";
  for (size_t i = 0; i < runs.size(); ++i) h << "<th>last</th><th>best (step)</th>";
  h << "</tr>\n";
  for (const auto& m : metrics) {
    h << "<tr><td>" << esc(m) << "</td>";
    for (const auto& r : runs) {
      const Held x = held_out(r, m);
      h << "<td data-run=\"" << esc(r.name) << "\" data-metric=\"" << esc(m) << "\" data-col=\"last\">"
        << cell(x.last, x.last_step, false) << "</td><td data-run=\"" << esc(r.name) << "\" data-metric=\"" << esc(m)
        << "\" data-col=\"best\">" << cell(x.best, x.best_step, true) << "</td>";
    }
    h << "</tr>\n";
  }
  h << "</table></details>\n";
  return h.str();
}

// The single-run form: one row per headline metric, start -> last (best at step).
std::string held_out_html(const Run& r, const std::vector<std::string>& metrics) {
  if (metrics.empty())
    return "<p class=\"note\">No held-out metrics: this run logged no validation (val-core/...) values "
           "(no data.val_files, or test_freq never reached).</p>\n";
  std::ostringstream h;
  h << "<table class=\"heldout\"><tr><th>held-out metric</th><th>start</th><th></th><th>last</th><th>best (step)</th></tr>\n";
  for (const auto& m : metrics) {
    const Held x = held_out(r, m);
    h << "<tr><td>" << esc(short_metric(m)) << "</td><td>" << cell(x.start, x.start_step, true) << "</td><td>&rarr;</td><td>"
      << cell(x.last, x.last_step, true) << "</td><td data-metric=\"" << esc(m) << "\">" << cell(x.best, x.best_step, true)
      << "</td></tr>\n";
  }
  h << "</table>\n";
  return h.str();
}

std::string time_split_html(const Run& r) {
  static const std::vector<std::pair<std::string, std::string>> parts = {
      {"timing_s/gen", "generation"}, {"timing_s/reward", "reward"}, {"timing_s/old_log_prob", "old log-probs"},
      {"timing_s/ref", "reference log-probs"}, {"timing_s/adv", "advantages"}, {"timing_s/update_actor", "update"}};
  const double step = mean_of(r, "timing_s/step");
  if (std::isnan(step)) return "<p class=\"note\">No step times logged (timing_s/step).</p>\n";
  std::ostringstream h;
  h << "<table class=\"timing\"><tr><th>phase</th><th>mean s / step</th><th>share</th></tr>\n";
  for (const auto& [key, label] : parts) {
    const double v = mean_of(r, key);
    if (std::isnan(v)) continue;
    h << "<tr><td>" << label << "</td><td>" << fixed(v, 3) << "</td><td><span class=\"bar\" style=\"width:"
      << fixed(step > 0 ? 120.0 * v / step : 0.0, 0) << "px\"></span> " << fixed(step > 0 ? 100.0 * v / step : 0.0, 1)
      << "%</td></tr>\n";
  }
  h << "<tr><td><b>step</b></td><td><b>" << fixed(step, 3) << "</b></td><td></td></tr></table>\n";
  return h.str();
}

std::string samples_html(const Run& r) {
  if (r.samples.empty()) return "<p class=\"note\">No sample generations logged (samples.jsonl).</p>\n";
  // The newest logged step's generations.
  const nlohmann::json newest_step = r.samples.back().contains("step") ? r.samples.back()["step"] : nlohmann::json();
  std::vector<const nlohmann::json*> newest;
  for (auto it = r.samples.rbegin(); it != r.samples.rend() && newest.size() < 8; ++it)
    if (!it->contains("step") || (*it)["step"] == newest_step) newest.insert(newest.begin(), &*it);
  std::ostringstream h;
  h << "<table class=\"samples\"><tr><th>step</th><th>prompt</th><th>response</th><th>score</th></tr>\n";
  for (const auto* s : newest) {
    auto text = [&](const char* key) {
      if (!s->contains(key)) return std::string();
      const auto& v = (*s)[key];
      return esc(v.is_string() ? v.get<std::string>() : v.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    };
    h << "<tr><td>" << text("step") << "</td><td><pre>" << text("prompt") << "</pre></td><td><pre>" << text("response")
      << "</pre></td><td>" << text("score") << "</td></tr>\n";
  }
  h << "</table>\n";
  return h.str();
}

// ---- charts ------------------------------------------------------------------------------

// The panels a researcher looks at first, in this order; everything else follows by group.
int key_rank(const std::string& m) {
  static const std::vector<std::vector<std::string>> order = {
      {"val-core/"},
      {"critic/score/mean", "acc/mean"},
      {"response_length/mean"},
      {"actor/ppo_kl", "actor/kl_loss", "actor/ref_kl", "actor/rpg_kl"},
      {"actor/entropy"},
      {"actor/grad_norm"},
      {"actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/pg_clipfrac_upper", "response_length/clip_ratio"},
      {"timing_s/step"}};
  int rank = 0;
  for (const auto& group : order) {
    for (const auto& key : group) {
      if (key.back() == '/' ? m.rfind(key, 0) == 0 && is_headline(m) : m == key) return rank;
      ++rank;
    }
  }
  return -1;
}

std::string unit_of(const std::string& m) {
  if (m.rfind("timing_s/", 0) == 0) return "seconds";
  if (m.find("tokens_per_s") != std::string::npos) return "tokens / s";
  if ((m.rfind("response_length/", 0) == 0 || m.rfind("prompt_length/", 0) == 0) && m.find("clip_ratio") == std::string::npos)
    return "tokens";
  if (m.rfind("val-core/", 0) == 0 && m.find("/acc/") != std::string::npos) return "accuracy";
  if (m.find("clipfrac") != std::string::npos || m.find("clip_ratio") != std::string::npos) return "fraction";
  return "";
}

std::string steps_list(const std::set<double>& steps) {
  std::string s;
  size_t i = 0;
  for (double st : steps) {
    if (i++ == 8) return s + ", ...";
    s += (s.empty() ? "" : ", ") + format_step(st);
  }
  return s;
}

// A metric across runs: a chart, or one line of text when there is nothing to draw.
struct Panel {
  std::string metric;
  std::string html;       // the figure, or "" when the metric is a text line
  std::string line;       // a constant / undrawable metric as a line of text
  bool constant = false;
};

Panel make_panel(const std::string& metric, const std::vector<Run>& runs) {
  Panel p{metric, "", "", false};
  std::vector<ChartSeries> series;
  std::vector<std::string> notes;
  size_t drawable = 0, finite_total = 0;
  double lo = INFINITY, hi = -INFINITY, first = INFINITY, last = -INFINITY, stride = 0;
  for (const auto& r : runs) {
    ChartSeries s{r.name, {}};
    if (auto it = r.values.find(metric); it != r.values.end()) {
      const Series& v = it->second;
      for (const auto& [step, value] : v.points) s.points.emplace_back(step, value);
      if (!v.empty()) lo = std::min(lo, v.lo), hi = std::max(hi, v.hi), finite_total += v.count;
      if (!v.points.empty()) first = std::min(first, v.points.begin()->first), last = std::max(last, v.points.rbegin()->first);
      stride = std::max(stride, v.stride);
    }
    if (auto it = r.nonfinite.find(metric); it != r.nonfinite.end() && it->second.count > 0)
      notes.push_back(str(runs.size() > 1 ? r.name + ": " : "", it->second.count, " NaN/inf value",
                          it->second.count > 1 ? "s" : "", " not drawn (step", it->second.count > 1 ? "s " : " ",
                          steps_list(it->second.steps), ")"));
    if (s.points.size() >= 2) ++drawable;
    series.push_back(std::move(s));  // every run keeps its colour, logged or not
  }
  const std::string name = esc(metric);
  std::string note_text;
  for (const auto& n : notes) note_text += (note_text.empty() ? "" : "; ") + n;
  if (finite_total == 0) {
    p.line = str("<b>", name, "</b>: no chart: no finite value was logged", note_text.empty() ? "" : " (" + esc(note_text) + ")");
    return p;
  }
  if (lo == hi && finite_total >= 2 && notes.empty()) {
    p.constant = true;
    p.line = str("<b>", name, "</b> = ", format_number(lo), " at every step (", format_step(first), "&ndash;",
                 format_step(last), runs.size() > 1 ? ", every run" : "", ")");
    return p;
  }
  if (drawable == 0) {
    std::string vals;
    for (const auto& s : series)
      if (!s.points.empty())
        vals += str(vals.empty() ? "" : "; ", runs.size() > 1 ? s.name + " " : "", "step ", format_step(s.points[0].first),
                    ": ", format_number(s.points[0].second));
    p.line = str("<b>", name, "</b>: no chart: one value per run only (", esc(vals), "); a line needs two logged steps",
                 note_text.empty() ? "" : "; " + esc(note_text));
    return p;
  }
  ChartOptions o;
  o.metric = metric;
  o.y_unit = unit_of(metric);
  // Validation values are few and exact (each one a full evaluation): never smoothed.
  o.smoothing = metric.rfind("val-", 0) == 0 ? 0.0 : kDefaultSmoothing;
  std::ostringstream h;
  h << "<figure class=\"panel\"><figcaption><b>" << name << "</b>";
  if (runs.size() == 1) {
    const auto& pts = series[0].points;
    h << " <small>last " << format_number(pts.back().second) << " at step " << format_step(pts.back().first) << " (min "
      << format_number(lo) << ", max " << format_number(hi) << ")</small>";
  } else {
    std::string missing;
    for (const auto& s : series)
      if (s.points.empty()) missing += (missing.empty() ? "" : ", ") + s.name;
    if (!missing.empty()) h << " <small>not logged by " << esc(missing) << "</small>";
  }
  h << "</figcaption>" << line_chart_svg(series, o) << "<div class=\"readout\">&nbsp;</div>";
  if (stride > 0)
    h << "<p class=\"note thinned\">" << finite_total << " values logged" << (runs.size() > 1 ? " by the runs" : "")
      << "; drawn: every step that is a multiple of " << format_number(stride) << " and the newest (as TensorBoard, a long "
      << "series is thinned; min and max are over every value)</p>";
  if (!note_text.empty()) h << "<p class=\"note\">" << esc(note_text) << "</p>";
  h << "</figure>\n";
  p.html = h.str();
  return p;
}

constexpr const char* kStyle =
    "body{font-family:system-ui,sans-serif;margin:1.5em 2em;color:#222;max-width:1280px}"
    "h1{font-size:1.5em;margin-bottom:.2em}h2{border-bottom:1px solid #ccc;margin-top:1.5em}h3{margin:.8em 0 .3em}"
    "table{border-collapse:collapse;margin:.5em 0}td,th{padding:.25em .6em;border-bottom:1px solid #e6e6e6;"
    "text-align:left;vertical-align:top;font-size:14px}th{background:#f3f3f3}"
    "table.table3 td,table.heldout td,table.timing td{font-variant-numeric:tabular-nums}"
    "pre{background:#f6f6f6;padding:.5em;margin:0;overflow:auto;max-height:14em;max-width:34em;white-space:pre-wrap}"
    "details pre{max-width:none;max-height:40em}"
    ".grid{display:grid;grid-template-columns:repeat(auto-fill,580px);gap:12px}"
    "figure.panel{margin:0;padding:6px 8px;border:1px solid #e3e3e3;border-radius:4px;width:560px}"
    "figcaption{font-size:13px;margin-bottom:2px}figcaption small{color:#666}"
    ".readout{font-size:12px;min-height:1.3em;color:#333}.note{color:#8a5a00;font-size:13px}"
    ".bar{display:inline-block;height:.7em;background:#999;vertical-align:middle}"
    ".controls{position:sticky;top:0;background:#fff;padding:.4em 0;border-bottom:1px solid #eee;z-index:1;font-size:14px}"
    "ul.legend{display:inline;list-style:none;padding:0;margin:0 0 0 1.5em}ul.legend li{display:inline-block;margin-right:1em}"
    ".swatch{display:inline-block;width:18px;height:3px;vertical-align:middle;margin-right:4px}"
    "ul.constants{font-size:13px;columns:2}input[type=range]{accent-color:#555;vertical-align:middle}";

// Smoothing slider and nearest-point readout; plain DOM, no framework, nothing fetched.
constexpr const char* kScript = R"JS(<script>
(() => {
  const slider = document.getElementById('smoothing'), shown = document.getElementById('smoothing-value');
  const nums = s => s.split(' ').map(Number);
  const ema = (ys, w) => { let last = 0; return ys.map((y, k) => { last = last * w + (1 - w) * y; const d = 1 - Math.pow(w, k + 1); return d > 0 ? last / d : y; }); };
  function smooth() {
    const w = Number(slider.value);
    shown.textContent = w.toFixed(2);
    for (const g of document.querySelectorAll('svg.chart g.series')) {
      const raw = g.querySelector('polyline.raw'), sm = g.querySelector('polyline.smooth');
      if (!raw || !sm) continue;
      const svg = g.ownerSVGElement, y0 = Number(svg.dataset.y0), y1 = Number(svg.dataset.y1), p = nums(svg.dataset.plot);
      const xs = Array.from(raw.points).map(q => q.x);
      sm.setAttribute('points', ema(nums(g.dataset.values), w).map((v, k) => xs[k].toFixed(1) + ',' + (p[1] + (1 - (v - y0) / (y1 - y0)) * p[3]).toFixed(1)).join(' '));
      sm.setAttribute('visibility', w > 0 ? 'visible' : 'hidden');
      raw.setAttribute('stroke-opacity', w > 0 ? '0.3' : '1');
    }
  }
  if (slider) slider.addEventListener('input', smooth);
  for (const svg of document.querySelectorAll('svg.chart')) {
    const fig = svg.closest('figure'), out = fig && fig.querySelector('.readout'), cursor = svg.querySelector('line.cursor');
    if (!out) continue;
    const p = nums(svg.dataset.plot), x0 = Number(svg.dataset.x0), x1 = Number(svg.dataset.x1);
    svg.addEventListener('mousemove', e => {
      const pt = new DOMPoint(e.clientX, e.clientY).matrixTransform(svg.getScreenCTM().inverse());
      const at = x0 + (pt.x - p[0]) / p[2] * (x1 - x0);
      let step = null;
      const series = Array.from(svg.querySelectorAll('g.series')).map(g => ({name: g.dataset.series, colour: g.dataset.colour, steps: nums(g.dataset.steps), values: nums(g.dataset.values)}));
      for (const s of series) for (const st of s.steps) if (step === null || Math.abs(st - at) < Math.abs(step - at)) step = st;
      if (step === null) return;
      out.textContent = 'step ' + step + ':';
      for (const s of series) {
        const k = s.steps.indexOf(step);
        if (k < 0) continue;
        const span = document.createElement('span');
        span.style.color = s.colour;
        span.textContent = '  ' + (series.length > 1 ? s.name + ' ' : '') + Number(s.values[k].toPrecision(5));
        out.appendChild(span);
      }
      const x = p[0] + (step - x0) / (x1 - x0) * p[2];
      cursor.setAttribute('x1', x); cursor.setAttribute('x2', x); cursor.setAttribute('visibility', 'visible');
    });
    svg.addEventListener('mouseleave', () => cursor.setAttribute('visibility', 'hidden'));
  }
})();
</script>
)JS";

}  // namespace

std::string render_report(const std::vector<RunInput>& inputs) {
  if (inputs.empty()) throw UsageError("report: no run directory given");
  std::vector<Run> runs;
  for (const auto& in : inputs) runs.push_back(load_run(in));
  const bool several = runs.size() > 1;
  const auto headline = headline_metrics(runs);

  std::ostringstream html;
  const std::string title = several ? str(runs.size(), " runs compared") : "run " + runs[0].name;
  html << "<!doctype html>\n<html><head><meta charset=\"utf-8\"><title>rpg " << esc(title) << "</title><style>" << kStyle
       << "</style></head><body>\n<h1>rpg " << esc(title) << "</h1>\n<p class=\"meta\">";
  for (const auto& r : runs)
    html << esc(r.name) << ": " << esc(fs::absolute(r.dir).lexically_normal().string()) << ", " << r.records
         << " metric records<br>";
  html << "</p>\n<section id=\"summary\"><h2>Summary</h2>\n" << runs_table(runs);
  if (several) {
    html << "<h3>Held-out accuracy (the paper's Table 3 layout)</h3>\n";
    if (headline.empty())
      html << "<p class=\"note\">No held-out metrics: none of these runs logged validation (val-core/...) values.</p>\n";
    else
      html << table3_html(runs, headline);
    if (const auto all = validation_metrics(runs); !all.empty()) html << all_validation_html(runs, all);
  } else {
    html << "<h3>Held-out accuracy</h3>\n" << held_out_html(runs[0], headline) << "<h3>Where a step's time goes</h3>\n"
         << time_split_html(runs[0]) << "<h3>Newest sample generations</h3>\n" << samples_html(runs[0]);
  }
  html << "</section>\n";

  // Every metric any run logged, the key panels first.
  std::set<std::string> names;
  for (const auto& r : runs) {
    for (const auto& [k, v] : r.values) names.insert(k);
    for (const auto& [k, v] : r.nonfinite) names.insert(k);
  }
  std::vector<std::string> key, rest;
  for (const auto& m : names) (key_rank(m) >= 0 ? key : rest).push_back(m);
  std::stable_sort(key.begin(), key.end(), [](const auto& a, const auto& b) { return key_rank(a) < key_rank(b); });

  html << "<div class=\"controls\"><label>EMA smoothing <input type=\"range\" id=\"smoothing\" min=\"0\" max=\"0.99\" "
          "step=\"0.01\" value=\""
       << kDefaultSmoothing << "\"> <output id=\"smoothing-value\">" << fixed(kDefaultSmoothing, 2)
       << "</output></label> <small>(series of " << kMinSmoothPoints
       << "+ points; the raw series stays faded behind; hover a chart for values)</small>";
  if (several) {
    html << "<ul class=\"legend\">";
    for (size_t i = 0; i < runs.size(); ++i)
      html << "<li data-run=\"" << esc(runs[i].name) << "\"><span class=\"swatch\" style=\"background:" << series_colour(i)
           << "\"></span>" << esc(runs[i].name) << "</li>";
    html << "</ul>";
  }
  html << "</div>\n<section id=\"charts\">\n";
  if (names.empty()) html << "<p class=\"note\">No metrics logged yet: metrics.jsonl has no step records.</p>\n";
  std::vector<std::string> lines, constants;
  auto emit = [&](const std::vector<std::string>& metrics) {
    std::string figures;
    for (const auto& m : metrics) {
      Panel p = make_panel(m, runs);
      if (!p.html.empty()) figures += p.html;
      else (p.constant ? constants : lines).push_back(p.line);
    }
    return figures;
  };
  if (!key.empty()) {
    const std::string figures = emit(key);
    html << "<h2>Key metrics</h2>\n";
    if (!figures.empty()) html << "<div class=\"grid\">\n" << figures << "</div>\n";
  }
  std::map<std::string, std::vector<std::string>> groups;
  for (const auto& m : rest) groups[m.find('/') == std::string::npos ? "other" : m.substr(0, m.find('/'))].push_back(m);
  if (!groups.empty()) html << "<h2>All other metrics</h2>\n";
  for (const auto& [group, metrics] : groups) {
    const std::string figures = emit(metrics);
    if (!figures.empty()) html << "<h3>" << esc(group) << "</h3>\n<div class=\"grid\">\n" << figures << "</div>\n";
  }
  if (!lines.empty()) {
    html << "<h2>Metrics without a chart</h2>\n<ul class=\"nochart\">\n";
    for (const auto& l : lines) html << "<li>" << l << "</li>\n";
    html << "</ul>\n";
  }
  if (!constants.empty()) {
    html << "<h2>Constant metrics</h2>\n<ul class=\"constants\">\n";
    for (const auto& l : constants) html << "<li>" << l << "</li>\n";
    html << "</ul>\n";
  }
  html << "</section>\n";
  for (const auto& r : runs)
    if (!r.config_text.empty())
      html << "<details><summary>configuration" << (several ? " of " + esc(r.name) : "") << " (config.yaml)</summary><pre>"
           << esc(r.config_text) << "</pre></details>\n";
  html << kScript << "</body></html>\n";
  return html.str();
}

std::string render_report(const fs::path& run_dir) { return render_report(name_runs({run_dir})); }

std::string table3_markdown(const std::vector<RunInput>& inputs) {
  std::vector<Run> runs;
  for (const auto& in : inputs) runs.push_back(load_run(in));
  const auto metrics = headline_metrics(runs);
  std::ostringstream md;
  md << "| Run |";
  for (const auto& m : metrics) {
    const std::string n = short_metric(m);
    md << " " << n << " start | " << n << " last | " << n << " best (step) |";
  }
  md << "\n|---|";
  for (size_t i = 0; i < metrics.size(); ++i) md << "---|---|---|";
  md << "\n";
  for (const auto& r : runs) {
    md << "| " << r.name << " |";
    for (const auto& m : metrics) {
      const Held x = held_out(r, m);
      md << " " << cell(x.start, x.start_step, false) << " | " << cell(x.last, x.last_step, false) << " | "
         << cell(x.best, x.best_step, true) << " |";
    }
    md << "\n";
  }
  if (metrics.empty()) md << "\n(no validation metrics logged)\n";
  if (const auto all = validation_metrics(runs); !all.empty()) {
    md << "\nEvery validation metric, last and best (step):\n\n| Metric |";
    for (const auto& r : runs) md << " " << r.name << " last | " << r.name << " best (step) |";
    md << "\n|---|";
    for (size_t i = 0; i < runs.size(); ++i) md << "---|---|";
    md << "\n";
    for (const auto& m : all) {
      md << "| " << m << " |";
      for (const auto& r : runs) {
        const Held x = held_out(r, m);
        md << " " << cell(x.last, x.last_step, false) << " | " << cell(x.best, x.best_step, true) << " |";
      }
      md << "\n";
    }
  }
  return md.str();
}

fs::path write_report(const std::vector<RunInput>& runs, const fs::path& out) {
  write_file_atomic(out, render_report(runs));
  return out;
}

fs::path write_report(const fs::path& run_dir) { return write_report(name_runs({run_dir}), run_dir / "report.html"); }

}  // namespace rpg::eval
