#include "rpg/eval/metrics.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <unordered_map>

#include "rpg/core/error.h"

namespace rpg::eval {

double pass_at_k(int64_t n, int64_t c, int64_t k) {
  if (n < 1 || c < 0 || c > n || k < 1 || k > n)
    throw ValueError(str("pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n=", n, " c=", c, " k=", k));
  if (n - c < k) return 1.0;
  // 1 - prod_{i=n-c+1}^{n} (1 - k / i): C(n-c, k) / C(n, k) without huge binomials.
  double keep = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) keep *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  return 1.0 - keep;
}

Moments best_of_k(std::span<const double> values, int64_t k, bool min) {
  if (values.empty() || k < 1) throw ValueError(str("best_of_k: need values and k >= 1, got ", values.size(), " values, k=", k));
  std::vector<double> v(values.begin(), values.end());
  std::sort(v.begin(), v.end());
  if (min) {
    std::reverse(v.begin(), v.end());
    for (double& x : v) x = -x;
  }
  // P(max <= v_(i)) = (i/n)^k over the sorted values; ties need no special care because the
  // probability masses of equal values add up to the same total.
  const double n = static_cast<double>(v.size());
  std::vector<double> p(v.size());
  double mean = 0, prev = 0;
  for (size_t i = 0; i < v.size(); ++i) {
    double cdf = std::pow(static_cast<double>(i + 1) / n, static_cast<double>(k));
    p[i] = cdf - prev;
    prev = cdf;
    mean += p[i] * v[i];
  }
  double var = 0;  // two passes: no cancellation when the spread is tiny
  for (size_t i = 0; i < v.size(); ++i) var += p[i] * (v[i] - mean) * (v[i] - mean);
  return {min ? -mean : mean, std::sqrt(var)};
}

double majority_value(std::span<const double> values, std::span<const std::string> preds) {
  if (values.size() != preds.size() || values.empty())
    throw ValueError(str("majority_value: ", values.size(), " values for ", preds.size(), " predictions"));
  std::unordered_map<std::string_view, std::pair<size_t, size_t>> seen;  // pred -> (count, first index)
  std::vector<std::string_view> order;
  for (size_t i = 0; i < preds.size(); ++i) {
    auto [it, inserted] = seen.try_emplace(preds[i], 0, i);
    if (inserted) order.push_back(preds[i]);
    ++it->second.first;
  }
  std::string_view best = order[0];
  for (auto p : order)
    if (seen[p].first > seen[best].first) best = p;
  return values[seen[best].second];
}

Moments majority_of_k(std::span<const double> values, std::span<const std::string> preds, int64_t k,
                      int64_t n_bootstrap, uint64_t seed) {
  if (values.size() != preds.size() || values.empty() || k < 1 || n_bootstrap < 1)
    throw ValueError(str("majority_of_k: ", values.size(), " values, ", preds.size(), " predictions, k=", k,
                         ", n_bootstrap=", n_bootstrap));
  // Predictions as small integers, so one resample is a few array operations.
  std::unordered_map<std::string_view, size_t> ids;
  std::vector<size_t> id(preds.size());
  for (size_t i = 0; i < preds.size(); ++i) id[i] = ids.try_emplace(preds[i], ids.size()).first->second;
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, values.size() - 1);
  std::vector<int64_t> count(ids.size(), 0);
  std::vector<size_t> draw(static_cast<size_t>(k)), order;
  std::vector<double> first_value(ids.size());
  std::vector<double> results(static_cast<size_t>(n_bootstrap));
  for (auto& result : results) {
    order.clear();
    for (auto& d : draw) {
      d = pick(rng);
      size_t p = id[d];
      if (count[p]++ == 0) {
        order.push_back(p);
        first_value[p] = values[d];
      }
    }
    size_t best = order[0];
    for (size_t p : order)
      if (count[p] > count[best]) best = p;
    result = first_value[best];
    for (size_t p : order) count[p] = 0;
  }
  double mean = 0, var = 0;
  for (double r : results) mean += r;
  mean /= static_cast<double>(results.size());
  for (double r : results) var += (r - mean) * (r - mean);
  return {mean, std::sqrt(var / static_cast<double>(results.size()))};
}

std::vector<int64_t> bootstrap_sizes(int64_t n) {
  std::vector<int64_t> out;
  if (n <= 1) return out;
  for (int64_t k = 2; k < n; k *= 2) out.push_back(k);
  out.push_back(n);
  return out;
}

std::vector<int64_t> pass_sizes(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t k = 1; k < n; k *= 2) out.push_back(k);
  if (n >= 1) out.push_back(n);
  return out;
}

namespace {

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return s / static_cast<double>(v.size());
}

double std_of(const std::vector<double>& v) {
  double m = mean_of(v), s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / static_cast<double>(v.size()));
}

struct Problem {
  std::vector<double> acc, score, reward;
  std::vector<std::string> preds;
  bool all_preds = true, all_rewards = true;
};

void variable_metrics(const std::string& var, const std::vector<double>& v, const Problem& p,
                      std::map<std::string, double>& out) {
  const auto n = static_cast<int64_t>(v.size());
  out[str(var, "/mean@", n)] = mean_of(v);
  if (n <= 1) return;
  out[str(var, "/std@", n)] = std_of(v);
  for (int64_t k : bootstrap_sizes(n)) {
    auto best = best_of_k(v, k), worst = best_of_k(v, k, /*min=*/true);
    out[str(var, "/best@", k, "/mean")] = best.mean;
    out[str(var, "/best@", k, "/std")] = best.std;
    out[str(var, "/worst@", k, "/mean")] = worst.mean;
    out[str(var, "/worst@", k, "/std")] = worst.std;
  }
  if (p.all_preds) {
    out[str(var, "/maj@", n)] = majority_value(v, p.preds);
    for (int64_t k : bootstrap_sizes(n)) {
      auto maj = majority_of_k(v, p.preds, k);
      out[str(var, "/maj@", k, "/mean")] = maj.mean;
      out[str(var, "/maj@", k, "/std")] = maj.std;
    }
  }
}

}  // namespace

MetricTable compute_metrics(std::span<const ScoredResponse> responses) {
  // data_source -> problem -> responses, problems in first-seen order.
  std::map<std::string, std::vector<Problem>> by_source;
  std::map<std::string, std::unordered_map<std::string, size_t>> index;
  for (const auto& r : responses) {
    auto& problems = by_source[r.data_source];
    auto [it, inserted] = index[r.data_source].try_emplace(r.problem, problems.size());
    if (inserted) problems.emplace_back();
    Problem& p = problems[it->second];
    p.acc.push_back(r.acc ? 1.0 : 0.0);
    p.score.push_back(r.score);
    if (r.pred) p.preds.push_back(*r.pred);
    else p.all_preds = false;
    if (r.reward) p.reward.push_back(*r.reward);
    else p.all_rewards = false;
  }
  MetricTable table;
  for (const auto& [source, problems] : by_source) {
    std::map<std::string, std::pair<double, int64_t>> sums;  // metric -> (sum, problems)
    int64_t responses_n = 0;
    for (const auto& p : problems) {
      std::map<std::string, double> m;
      variable_metrics("acc", p.acc, p, m);
      variable_metrics("score", p.score, p, m);
      if (p.all_rewards) variable_metrics("reward", p.reward, p, m);
      const auto n = static_cast<int64_t>(p.acc.size());
      int64_t c = 0;
      for (double a : p.acc) c += a != 0.0;
      for (int64_t k : pass_sizes(n)) m[str("acc/pass@", k)] = pass_at_k(n, c, k);
      for (const auto& [name, value] : m) {
        sums[name].first += value;
        sums[name].second += 1;
      }
      responses_n += n;
    }
    auto& out = table[source];
    for (const auto& [name, s] : sums) out[name] = s.first / static_cast<double>(s.second);
    out["num_problems"] = static_cast<double>(problems.size());
    out["num_responses"] = static_cast<double>(responses_n);
  }
  return table;
}

}  // namespace rpg::eval
