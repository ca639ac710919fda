#include "rpg/train/data_parallel.h"

#include <ATen/ATen.h>

#include "rpg/dist/data_parallel.h"
#include "rpg/dist/world.h"

namespace rpg::train::dp {

std::vector<rollout::Response> generate(rollout::RolloutEngine& engine, const std::vector<std::vector<int64_t>>& ids,
                                        rollout::SamplingParams sp) {
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return engine.generate(ids, sp);
  const auto mine = dist::shard(static_cast<int64_t>(ids.size()), pg->size(), pg->rank());
  std::vector<std::vector<int64_t>> part(ids.begin() + mine.begin, ids.begin() + mine.end);
  sp.prompt_index_offset += static_cast<uint64_t>(mine.begin);
  std::vector<rollout::Response> local;
  if (!part.empty()) local = engine.generate(part, sp);

  // Tokens, log-probs and (prompt, sample, finish, seconds) of every rank, in rank order.
  std::vector<std::vector<int64_t>> tokens;
  std::vector<double> log_probs, meta;
  for (const auto& r : local) {
    tokens.push_back(r.token_ids);
    std::vector<int64_t> lp_len{static_cast<int64_t>(r.log_probs.size())};
    tokens.push_back(lp_len);
    log_probs.insert(log_probs.end(), r.log_probs.begin(), r.log_probs.end());
    meta.insert(meta.end(), {static_cast<double>(r.prompt_index + mine.begin), static_cast<double>(r.sample_index),
                             static_cast<double>(r.finish_reason), r.seconds});
  }
  const auto all_tokens = dist::all_gather_sequences(*pg, tokens);
  const auto all_lp = dist::all_gather_values(*pg, log_probs);
  const auto all_meta = dist::all_gather_values(*pg, meta);
  std::vector<rollout::Response> out(all_meta.size() / 4);
  size_t lp = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    rollout::Response& r = out[i];
    r.token_ids = all_tokens[2 * i];
    const auto n = static_cast<size_t>(all_tokens[2 * i + 1].at(0));
    r.log_probs.assign(all_lp.begin() + static_cast<std::ptrdiff_t>(lp), all_lp.begin() + static_cast<std::ptrdiff_t>(lp + n));
    lp += n;
    r.prompt_index = static_cast<int64_t>(all_meta[4 * i]);
    r.sample_index = static_cast<int64_t>(all_meta[4 * i + 1]);
    r.finish_reason = static_cast<rollout::FinishReason>(static_cast<int>(all_meta[4 * i + 2]));
    r.seconds = all_meta[4 * i + 3];
  }
  return out;
}

std::pair<size_t, size_t> micro_batch_range(size_t count) {
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return {0, count};
  const auto mine = dist::shard(static_cast<int64_t>(count), pg->size(), pg->rank());
  return {static_cast<size_t>(mine.begin), static_cast<size_t>(mine.end)};
}

void sum_rows(at::Tensor& rows) {
  if (dist::ProcessGroup* pg = dist::world()) pg->all_reduce(rows, dist::ReduceOp::Sum);
}

std::map<std::string, size_t> metric_sizes(const std::map<std::string, std::vector<double>>& metrics) {
  std::map<std::string, size_t> out;
  for (const auto& [k, v] : metrics) out[k] = v.size();
  return out;
}

void reduce_update(const std::vector<at::Tensor>& params, std::map<std::string, std::vector<double>>& metrics,
                   const std::map<std::string, size_t>& before) {
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return;
  dist::all_reduce_gradients(*pg, params);
  // Metric names: a rank without micro-batches has none, so they are gathered first.
  std::vector<std::vector<int64_t>> names;
  for (const auto& [k, v] : metrics) names.emplace_back(k.begin(), k.end());
  std::map<std::string, bool> all_names;
  for (const auto& n : dist::all_gather_sequences(*pg, names)) all_names[std::string(n.begin(), n.end())] = true;
  for (const auto& [name, unused] : all_names) {
    std::vector<double>& values = metrics[name];
    auto it = before.find(name);
    const size_t keep = it == before.end() ? 0 : it->second;
    std::vector<double> mine(values.begin() + static_cast<std::ptrdiff_t>(keep), values.end());
    values.resize(keep);
    for (double v : dist::all_gather_values(*pg, mine)) values.push_back(v);
  }
}

bool writes_run_dir() { return dist::is_main(); }

std::filesystem::path metrics_dir(const std::filesystem::path& root) {
  if (dist::is_main()) return root;
  return root / ("rank_" + std::to_string(dist::world()->rank()));
}

}  // namespace rpg::train::dp
