#include "rpg/reward/registry.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>

#include "rpg/core/error.h"
#include "rpg/reward/math_dapo.h"
#include "rpg/reward/math_lighteval.h"

namespace rpg::reward {

namespace {
bool is_prefix_key(const std::string& key) { return !key.empty() && key.back() == '*'; }
}  // namespace

void ScorerRegistry::add(std::string key, std::string description, ScoreFn fn) {
  if (key.empty() || key == "*") throw ValueError("reward scorer registry: empty key");
  if (!fn) throw ValueError(str("reward scorer registry: '", key, "' has no function"));
  for (const auto& e : entries_)
    if (e.key == key) throw ValueError(str("reward scorer registry: '", key, "' is registered twice"));
  entries_.push_back({std::move(key), std::move(description), std::move(fn)});
}

const ScorerRegistry::Entry* ScorerRegistry::match(std::string_view data_source) const {
  const Entry* best = nullptr;
  size_t best_len = 0;
  for (const auto& e : entries_) {
    if (!is_prefix_key(e.key)) {
      if (e.key == data_source) return &e;
      continue;
    }
    std::string_view prefix(e.key.data(), e.key.size() - 1);
    if (data_source.starts_with(prefix) && (!best || prefix.size() > best_len)) best = &e, best_len = prefix.size();
  }
  return best;
}

bool ScorerRegistry::contains(std::string_view data_source) const { return match(data_source) != nullptr; }

const ScoreFn& ScorerRegistry::find(std::string_view data_source) const {
  if (const Entry* e = match(data_source)) return e->fn;
  std::string known;
  for (const auto& e : entries_) known += (known.empty() ? "" : ", ") + e.key;
  throw ValueError(str("no reward scorer for data_source '", data_source, "'; known: ", known));
}

std::vector<std::pair<std::string, std::string>> ScorerRegistry::entries() const {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& e : entries_) out.emplace_back(e.key, e.description);
  return out;
}

std::vector<std::string> dapo_variant_names() { return {"math_dapo", "math_dapo_fork"}; }

void register_builtin_scorers(ScorerRegistry& registry, const ScorerOptions& options) {
  const bool strict = options.strict_box_verify;
  auto verl_rule = [strict](std::string_view response, std::string_view gt) { return dapo_score(response, gt, strict); };
  auto fork_rule = [strict](std::string_view response, std::string_view gt) {
    return dapo_score_fork(response, gt, strict);
  };
  const std::string verl_doc = strict ? "DAPO rule, strict box (verl math_dapo)"
                                      : "DAPO rule: last 'Answer:', else last \\boxed{} (verl 0.9.1 math_dapo)";
  const std::string fork_doc = strict ? "DAPO rule, strict box (the authors' fork's math_dapo)"
                                      : "DAPO rule: last 'Answer:' only, no \\boxed{} fallback (the authors' fork's math_dapo)";
  bool fork;
  if (options.dapo_variant == "math_dapo")
    fork = false;
  else if (options.dapo_variant == "math_dapo_fork")
    fork = true;
  else
    throw ValueError(str("dapo_variant: unknown '", options.dapo_variant, "'; valid: math_dapo, math_dapo_fork"));
  for (const char* key : {"math-dapo", "math_dapo", "math", "math_dapo_reasoning", "aime*", "amc*"}) {
    if (fork)
      registry.add(key, fork_doc, fork_rule);
    else
      registry.add(key, verl_doc, verl_rule);
  }
  registry.add("math_dapo_verl", verl_doc, verl_rule);
  registry.add("math_dapo_fork", fork_doc, fork_rule);
  for (const char* key : {"lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"})
    registry.add(key, "lighteval/MATH boxed-answer equivalence (verl math_reward)", lighteval_score);
}

ScorerRegistry builtin_scorers(const ScorerOptions& options) {
  ScorerRegistry r;
  register_builtin_scorers(r, options);
  return r;
}

std::vector<ScoreResult> score_batch(const ScorerRegistry& registry, std::span<const ScoreRequest> requests,
                                     int threads) {
  std::vector<const ScoreFn*> fns(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) fns[i] = &registry.find(requests[i].data_source);
  std::vector<ScoreResult> results(requests.size());
  size_t n_threads = threads > 0 ? static_cast<size_t>(threads) : std::max(1u, std::thread::hardware_concurrency());
  n_threads = std::min(n_threads, std::max<size_t>(1, requests.size()));
  std::atomic<size_t> next{0};
  std::exception_ptr error;
  std::mutex error_mu;
  auto work = [&] {
    while (true) {
      size_t i = next.fetch_add(1);
      if (i >= requests.size()) return;
      try {
        results[i] = (*fns[i])(requests[i].response, requests[i].ground_truth);
      } catch (...) {
        std::lock_guard lock(error_mu);
        if (!error) error = std::current_exception();
        next = requests.size();
      }
    }
  };
  if (n_threads <= 1) {
    work();
  } else {
    std::vector<std::thread> pool;
    for (size_t t = 0; t < n_threads; ++t) pool.emplace_back(work);
    for (auto& t : pool) t.join();
  }
  if (error) std::rethrow_exception(error);
  return results;
}

namespace {

class BuiltinScorer final : public RewardScorer {
 public:
  BuiltinScorer(ScorerRegistry registry, int threads) : registry_(std::move(registry)), threads_(threads) {}
  void check_data_source(std::string_view data_source) const override { (void)registry_.find(data_source); }
  RewardScores score(std::span<const ScoreRequest> requests) override {
    RewardScores out;
    out.results = score_batch(registry_, requests, threads_);
    return out;
  }
  std::string describe() const override { return "built-in rule scorers (by data_source)"; }

 private:
  ScorerRegistry registry_;
  int threads_;
};

}  // namespace

std::unique_ptr<RewardScorer> make_builtin_scorer(ScorerRegistry registry, int threads) {
  return std::make_unique<BuiltinScorer>(std::move(registry), threads);
}

}  // namespace rpg::reward
