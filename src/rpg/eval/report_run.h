// One run's directory as the report reads it (metrics.jsonl, config.yaml, algorithm.txt,
// samples.jsonl) and what the summary computes from it; report.cpp turns it into HTML.
// Internal to eval_report.
#pragma once

#include <cmath>
#include <cstddef>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rpg/core/config.h"
#include "rpg/eval/report.h"

namespace rpg::eval::report_detail {

// Past this many points a training series is thinned (TensorBoard keeps 1,000 per scalar).
constexpr size_t kMaxSeriesPoints = 1000;

// val-core/ and val-aux/ metrics: one point per validation, never thinned.
bool is_validation(const std::string& metric);

// A metric's values by step, as read from metrics.jsonl. What the report holds must not grow
// with the run (rpg report on a long run's metrics.jsonl; scripts/soak.sh once saw the
// trainer's RSS creep when it rewrote the report at every checkpoint): past kMaxSeriesPoints a training series
// keeps only the steps that are multiples of a doubling stride, and always the newest step,
// as TensorBoard downsamples its scalars. Count, sum, min and max stay exact over every value
// read (the time split's means, the captions, the constant test). Validation series
// (val-core/, val-aux/) are never thinned: they have one point per validation, and the
// tables show their start, last and best. A step logged twice keeps its later value (the
// trainer cuts metrics.jsonl back to the checkpoint it resumes from, so it does not log one
// twice itself; when the earlier copy was thinned away, count and sum hold both).
struct Series {
  std::map<double, double> points;
  double stride = 0;  // 0: every step kept
  bool thin = true;
  size_t count = 0;
  double sum = 0, lo = INFINITY, hi = -INFINITY;

  bool on_stride(double step) const { return stride == 0 || std::fmod(step, stride) == 0; }
  void set(double step, double v);
  void erase(double step) {  // a later record made this step NaN / inf
    if (auto it = points.find(step); it != points.end()) sum -= it->second, --count, points.erase(it);
  }
  bool empty() const { return count == 0; }
  double mean() const { return count ? sum / static_cast<double>(count) : NAN; }
};

// Steps where a metric was NaN / inf (logged as null): the count, and the first
// kMaxSeriesPoints steps (a report names at most 8).
struct NonFinite {
  std::set<double> steps;
  size_t count = 0;
  void add(double step) {
    if (steps.count(step)) return;
    ++count;
    if (steps.size() < kMaxSeriesPoints) steps.insert(step);
  }
  void erase(double step) {
    if (steps.erase(step)) --count;
  }
};

// One run as read from its directory.
struct Run {
  std::string name;
  std::filesystem::path dir;
  size_t records = 0;
  std::map<std::string, Series> values;
  std::map<std::string, NonFinite> nonfinite;
  std::optional<ConfigNode> config;
  std::string config_text, config_error;
  std::string algorithm;  // algorithm.txt: the trainer's statement of what ran
  std::vector<nlohmann::json> samples;  // the newest logged step's, at most kSamplesShown
  double last_step() const {
    double s = -INFINITY;
    for (const auto& [k, v] : values)
      if (!v.points.empty()) s = std::max(s, v.points.rbegin()->first);
    return s;
  }
};

constexpr size_t kSamplesShown = 8;

// Reads one run directory. Throws IoError without metrics.jsonl; a config.yaml that does not
// parse is kept as text with its error (the charts are still worth showing).
Run load_run(const RunInput& in);

// A dotted key of the run's config.yaml as written, or "" when absent.
std::string cfg(const Run& run, const std::string& dotted);

// Headline validation metrics: per data source, the mean over samples (mean@n), as the
// paper's Table 3 reports; the other validation statistics (std, best@k, maj@k, pass@k) are
// charted.
bool is_headline(const std::string& metric);

struct Held {
  bool any = false;
  double start = NAN, start_step = NAN, last = NAN, last_step = NAN, best = NAN, best_step = NAN;
};

// Start = the first value, Last = the newest, Best = the highest after step 0 (step 0 is the
// model before any update); when every value is at step 0, Best is over all of them.
Held held_out(const Run& run, const std::string& metric);

// The headline metrics any of `runs` logged (also those logged only as NaN), sorted.
std::vector<std::string> headline_metrics(const std::vector<Run>& runs);

// What the trainer wrote it ran (algorithm.txt); a run directory from before that file
// existed shows its loss and estimator keys.
std::string algorithm_description(const Run& r);

// The mean of every finite value of `metric`, NaN when there is none.
double mean_of(const Run& r, const std::string& metric);

}  // namespace rpg::eval::report_detail
