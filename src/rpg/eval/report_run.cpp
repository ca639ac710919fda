#include "rpg/eval/report_run.h"

#include <algorithm>
#include <regex>
#include <sstream>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/jsonl.h"
#include "rpg/core/text.h"

namespace fs = std::filesystem;

namespace rpg::eval {
namespace report_detail {

bool is_validation(const std::string& metric) { return metric.rfind("val-core/", 0) == 0 || metric.rfind("val-aux/", 0) == 0; }

void Series::set(double step, double v) {
  lo = std::min(lo, v), hi = std::max(hi, v);
  if (auto it = points.find(step); it != points.end()) {
    sum += v - it->second;
    it->second = v;
    return;
  }
  sum += v, ++count;
  if (!points.empty()) {
    const double newest = points.rbegin()->first;
    if (step < newest && !on_stride(step)) return;
    if (step > newest && !on_stride(newest)) points.erase(std::prev(points.end()));  // no longer the newest
  }
  points.emplace(step, v);
  while (thin && points.size() > kMaxSeriesPoints) {
    stride = stride == 0 ? 2 : 2 * stride;
    const double newest = points.rbegin()->first;
    std::erase_if(points, [&](const auto& p) { return p.first != newest && !on_stride(p.first); });
  }
}

Run load_run(const RunInput& in) {
  Run run;
  run.name = in.name;
  run.dir = in.dir;
  const fs::path metrics = in.dir / "metrics.jsonl";
  if (!fs::exists(metrics)) throw IoError(str("no ", metrics.string(), ": not a run directory"));
  // One row at a time, never the whole file as JSON objects (~10x its size): the process
  // would otherwise grow with a long run's metrics.jsonl (seen in scripts/soak.sh when the
  // trainer still rewrote the report at every checkpoint: +20 MB RSS by step 3,000).
  jsonl::for_each(metrics, [&](size_t, nlohmann::json& r) {  // a torn last line is skipped
    ++run.records;
    if (!r.contains("step") || !r["step"].is_number()) return;
    const double step = r["step"].get<double>();
    for (const auto& [k, v] : r.items()) {
      if (k == "step") continue;
      if (v.is_number() && std::isfinite(v.get<double>())) {
        auto [it, added] = run.values.try_emplace(k);
        if (added) it->second.thin = !is_validation(k);
        it->second.set(step, v.get<double>());
        if (auto nf = run.nonfinite.find(k); nf != run.nonfinite.end()) nf->second.erase(step);
      } else if (v.is_null() || v.is_number()) {  // the metrics logger writes NaN / inf as null
        run.nonfinite[k].add(step);
        if (auto it = run.values.find(k); it != run.values.end()) it->second.erase(step);
      }
    }
  });
  if (fs::exists(in.dir / "config.yaml")) {
    run.config_text = read_file(in.dir / "config.yaml");
    try {
      run.config = parse_yaml(run.config_text, (in.dir / "config.yaml").string());
    } catch (const Error& e) {
      run.config_error = e.what();  // the charts are still worth showing
    }
  }
  if (const fs::path algorithm = in.dir / "algorithm.txt"; fs::exists(algorithm)) {
    run.algorithm = read_file(algorithm, 64 * 1024, "algorithm.txt");
    while (!run.algorithm.empty() && (run.algorithm.back() == '\n' || run.algorithm.back() == '\r')) run.algorithm.pop_back();
  }
  // Only the newest step's generations are shown: keep those, not the whole file.
  if (const fs::path samples = in.dir / "samples.jsonl"; fs::exists(samples))
    jsonl::for_each(samples, [&](size_t, nlohmann::json& j) {
      const nlohmann::json step = j.contains("step") ? j["step"] : nlohmann::json();
      if (!run.samples.empty() && run.samples.back().value("step", nlohmann::json()) != step) run.samples.clear();
      if (run.samples.size() == kSamplesShown) run.samples.erase(run.samples.begin());
      run.samples.push_back(std::move(j));
    });
  return run;
}

std::string cfg(const Run& run, const std::string& dotted) {
  if (!run.config) return "";
  const ConfigNode* n = &*run.config;
  std::stringstream path(dotted);
  for (std::string part; std::getline(path, part, '.');) {
    n = n->find(part);
    if (!n) return "";
  }
  if (n->kind == ConfigNode::Kind::Scalar) return n->scalar;
  if (n->kind == ConfigNode::Kind::List) {
    std::string s;
    for (const auto& item : n->list) s += (s.empty() ? "" : ", ") + item.scalar;
    return s;
  }
  return "";
}

bool is_headline(const std::string& metric) {
  static const std::regex re("^val-core/.+/mean@[0-9]+$");
  return std::regex_match(metric, re);
}

Held held_out(const Run& run, const std::string& metric) {
  Held h;
  const auto it = run.values.find(metric);
  if (it == run.values.end() || it->second.empty()) return h;
  const auto& v = it->second.points;  // validation series are never thinned
  h.any = true;
  h.start_step = v.begin()->first, h.start = v.begin()->second;
  h.last_step = v.rbegin()->first, h.last = v.rbegin()->second;
  const bool after_zero = v.rbegin()->first > 0;
  for (const auto& [step, value] : v)
    if ((!after_zero || step > 0) && (std::isnan(h.best) || value > h.best)) h.best = value, h.best_step = step;
  return h;
}

std::vector<std::string> headline_metrics(const std::vector<Run>& runs) {
  std::set<std::string> names;
  for (const auto& r : runs)
    for (const auto& [k, v] : r.values)
      if (is_headline(k)) names.insert(k);
  for (const auto& r : runs)  // a metric that was logged but only as NaN still gets its column
    for (const auto& [k, v] : r.nonfinite)
      if (is_headline(k)) names.insert(k);
  return {names.begin(), names.end()};
}

std::string algorithm_description(const Run& r) {
  if (!r.algorithm.empty()) return r.algorithm;
  std::string loss = cfg(r, "actor_rollout_ref.actor.policy_loss"), adv = cfg(r, "algorithm.adv_estimator");
  std::string s = loss.empty() ? "" : loss;
  if (!adv.empty()) s += (s.empty() ? "" : ", ") + str("advantage ", adv);
  return s;
}

double mean_of(const Run& r, const std::string& metric) {
  const auto it = r.values.find(metric);
  return it == r.values.end() ? NAN : it->second.mean();
}

}  // namespace report_detail

std::vector<nlohmann::json> read_jsonl(const fs::path& path, bool required) {
  if (!fs::exists(path)) {
    if (required) throw IoError(str("no ", path.string(), ": not a run directory"));
    return {};
  }
  return jsonl::read(path);  // a run being written (or killed) may have a torn last line
}

std::vector<RunInput> name_runs(const std::vector<fs::path>& dirs) {
  std::vector<std::vector<std::string>> parts;
  for (const auto& d : dirs) {
    std::vector<std::string> p;
    for (const auto& part : fs::absolute(d).lexically_normal())
      if (!part.empty() && part != "/") p.push_back(part.string());
    parts.push_back(p);
  }
  std::vector<RunInput> out;
  for (size_t i = 0; i < dirs.size(); ++i) {
    std::string name;
    for (size_t k = 1; k <= parts[i].size(); ++k) {
      auto suffix = [&](const std::vector<std::string>& p) {
        std::string s;
        for (size_t j = p.size() >= k ? p.size() - k : 0; j < p.size(); ++j) s += (s.empty() ? "" : "/") + p[j];
        return s;
      };
      name = suffix(parts[i]);
      bool unique = true;
      for (size_t j = 0; j < dirs.size(); ++j)
        if (j != i && suffix(parts[j]) == name) unique = false;
      if (unique) break;
    }
    out.push_back({name.empty() ? dirs[i].string() : name, dirs[i]});
  }
  return out;
}

}  // namespace rpg::eval
