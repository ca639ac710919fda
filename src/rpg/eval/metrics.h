// Evaluation metrics over k sampled responses per problem (torch-free):
//   mean@n   mean of the values over a problem's n responses, averaged over problems
//   std@n    their population standard deviation (numpy's np.std), averaged over problems
//   pass@k   unbiased estimator 1 - C(n-c, k) / C(n, k) (Chen et al. 2021), c = correct count
//   maj@n    value of the majority-voted prediction over all n responses (verl's
//            calc_maj_val: ties go to the prediction seen first; the value is that of its
//            first response); maj@k/mean, maj@k/std: its bootstrap over k-subsets, as verl
//   best@k / worst@k  expected max / min of the values over k responses drawn with
//            replacement -- the exact quantity verl's bootstrap (1000 resamples) estimates --
//            and the standard deviation of that max / min ("/mean", "/std" as verl names them)
// k runs over 1, 2, 4, ... < n and n (pass@k), 2, 4, ... < n and n (best / worst), as verl.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace rpg::eval {

// The unbiased pass@k for n samples of which c are correct. ValueError unless
// 0 <= c <= n and 1 <= k <= n.
double pass_at_k(int64_t n, int64_t c, int64_t k);

struct Moments {
  double mean = 0, std = 0;
};

// Exact E[max] and its standard deviation over k draws with replacement from `values`
// (E[min] when `min` is true). ValueError when values is empty or k < 1.
Moments best_of_k(std::span<const double> values, int64_t k, bool min = false);

// verl's calc_maj_val. ValueError when sizes differ or the span is empty.
double majority_value(std::span<const double> values, std::span<const std::string> preds);

// maj@k as verl reports it: the mean and standard deviation of majority_value over
// `n_bootstrap` samples of k responses drawn with replacement (our own seeded generator, so
// the numbers match verl's in distribution, not digit for digit).
Moments majority_of_k(std::span<const double> values, std::span<const std::string> preds, int64_t k,
                      int64_t n_bootstrap = 1000, uint64_t seed = 42);

// The k values verl reports for n responses: 2, 4, 8, ... < n, then n (none when n <= 1).
std::vector<int64_t> bootstrap_sizes(int64_t n);
// 1, 2, 4, ... < n, then n.
std::vector<int64_t> pass_sizes(int64_t n);

// One scored response.
struct ScoredResponse {
  std::string data_source;
  std::string problem;              // groups the responses of one problem (e.g. the prompt)
  double score = 0;                 // the reward
  bool acc = false;                 // 0/1 correctness
  std::optional<std::string> pred;  // the extracted answer (maj@n needs it on every response)
  // The score after reward shaping (the overlong penalty): verl's validation variable
  // "reward" (the reward manager's tensor; "score" is the scorer's own value). Set by the
  // trainer's validation; "reward/..." metrics exist when every response has one.
  std::optional<double> reward;
};

// data_source -> metric name -> value. Metric names: "acc/mean@32", "acc/std@32",
// "acc/pass@4", "acc/maj@32", "acc/maj@4/mean", "acc/maj@4/std", "acc/best@4/mean", "acc/best@4/std", "acc/worst@4/mean",
// "acc/worst@4/std", and the same for "score" and "reward" (without pass@k). A metric is averaged over
// the problems that have it (problems with different n give different names, as in verl);
// "num_problems" and "num_responses" are counts.
using MetricTable = std::map<std::string, std::map<std::string, double>>;
MetricTable compute_metrics(std::span<const ScoredResponse> responses);

}  // namespace rpg::eval
