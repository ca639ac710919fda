#include "rpg/rollout/batch.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <numeric>

#include "rpg/core/error.h"
#include "rpg/rollout/response.h"

namespace rpg::rollout {

bool Batch::has(const std::string& key) const { return tensors_.count(key) || strings_.count(key); }

std::vector<std::string> Batch::keys() const {
  std::vector<std::string> k;
  for (const auto& [name, t] : tensors_) k.push_back(name);
  for (const auto& [name, s] : strings_) k.push_back(name);
  std::sort(k.begin(), k.end());
  return k;
}

const at::Tensor& Batch::get(const std::string& key) const {
  auto it = tensors_.find(key);
  if (it == tensors_.end()) {
    std::string present;
    for (const auto& k : keys()) present += (present.empty() ? "" : ", ") + k;
    throw ValueError(str("batch has no tensor '", key, "' (it has: ", present.empty() ? "nothing" : present, ")"));
  }
  return it->second;
}

void Batch::check_rows(const std::string& key, int64_t n) {
  if (rows_ >= 0 && n != rows_)
    throw ValueError(str("batch key '", key, "' has ", n, " rows, the batch has ", rows_));
  rows_ = n;
}

void Batch::set(const std::string& key, at::Tensor value) {
  if (value.dim() == 0) throw ValueError(str("batch key '", key, "' must have a row dimension"));
  check_rows(key, value.size(0));
  tensors_[key] = std::move(value);
}

const std::vector<std::string>& Batch::strings(const std::string& key) const {
  auto it = strings_.find(key);
  if (it == strings_.end()) throw ValueError(str("batch has no strings '", key, "'"));
  return it->second;
}

void Batch::set_strings(const std::string& key, std::vector<std::string> values) {
  check_rows(key, static_cast<int64_t>(values.size()));
  strings_[key] = std::move(values);
}

Batch Batch::select(const std::vector<int64_t>& rows) const {
  Batch out;
  for (int64_t r : rows)
    if (r < 0 || r >= rows_) throw ValueError(str("batch select: row ", r, " out of range [0, ", rows_, ")"));
  if (tensors_.empty() && strings_.empty()) return out;
  at::Tensor index;
  for (const auto& [k, t] : tensors_) {
    if (!index.defined()) index = at::tensor(rows, at::kLong).to(t.device());
    out.set(k, t.index_select(0, index.to(t.device())));
  }
  for (const auto& [k, s] : strings_) {
    std::vector<std::string> picked;
    picked.reserve(rows.size());
    for (int64_t r : rows) picked.push_back(s[static_cast<size_t>(r)]);
    out.set_strings(k, std::move(picked));
  }
  out.rows_ = static_cast<int64_t>(rows.size());
  return out;
}

Batch Batch::concat(const std::vector<Batch>& parts) {
  Batch out;
  if (parts.empty()) return out;
  const auto names = parts[0].keys();
  for (const auto& p : parts)
    if (p.keys() != names) throw ValueError("batch concat: parts have different keys");
  for (const auto& [k, t] : parts[0].tensors_) {
    std::vector<at::Tensor> ts;
    for (const auto& p : parts) ts.push_back(p.tensors_.at(k));
    out.set(k, at::cat(ts, 0));
  }
  for (const auto& [k, s] : parts[0].strings_) {
    std::vector<std::string> all;
    for (const auto& p : parts) all.insert(all.end(), p.strings_.at(k).begin(), p.strings_.at(k).end());
    out.set_strings(k, std::move(all));
  }
  return out;
}

Batch make_rollout_batch(const std::vector<std::vector<int64_t>>& prompts, const std::vector<Response>& responses,
                         int64_t pad_token_id, int64_t min_prompt_length, int64_t min_response_length) {
  const int64_t rows = static_cast<int64_t>(responses.size());
  int64_t P = min_prompt_length, R = std::max<int64_t>(min_response_length, 1);
  for (const auto& r : responses) {
    if (r.prompt_index < 0 || r.prompt_index >= static_cast<int64_t>(prompts.size()))
      throw ValueError(str("response refers to prompt ", r.prompt_index, " of ", prompts.size()));
    P = std::max<int64_t>(P, static_cast<int64_t>(prompts[static_cast<size_t>(r.prompt_index)].size()));
    R = std::max<int64_t>(R, static_cast<int64_t>(r.token_ids.size()));
  }
  at::Tensor prompt_ids = at::full({rows, P}, pad_token_id, at::kLong);
  at::Tensor prompt_mask = at::zeros({rows, P}, at::kLong);
  at::Tensor response_ids = at::full({rows, R}, pad_token_id, at::kLong);
  at::Tensor response_mask = at::zeros({rows, R}, at::kLong);
  at::Tensor log_probs = at::zeros({rows, R}, at::kFloat);
  at::Tensor group = at::empty({rows}, at::kLong);
  auto pi = prompt_ids.accessor<int64_t, 2>(), pm = prompt_mask.accessor<int64_t, 2>();
  auto ri = response_ids.accessor<int64_t, 2>(), rm = response_mask.accessor<int64_t, 2>();
  auto lp = log_probs.accessor<float, 2>();
  for (int64_t b = 0; b < rows; ++b) {
    const Response& r = responses[static_cast<size_t>(b)];
    const auto& prompt = prompts[static_cast<size_t>(r.prompt_index)];
    const int64_t offset = P - static_cast<int64_t>(prompt.size());
    for (size_t t = 0; t < prompt.size(); ++t) {
      pi[b][offset + static_cast<int64_t>(t)] = prompt[t];
      pm[b][offset + static_cast<int64_t>(t)] = 1;
    }
    // The engine stops at the first stop token, so every generated token is in the mask.
    for (size_t t = 0; t < r.token_ids.size(); ++t) {
      ri[b][static_cast<int64_t>(t)] = r.token_ids[t];
      rm[b][static_cast<int64_t>(t)] = 1;
      lp[b][static_cast<int64_t>(t)] = r.log_probs[t];
    }
    group[b] = r.prompt_index;
  }
  Batch batch;
  batch.set("prompts", prompt_ids);
  batch.set("responses", response_ids);
  batch.set("input_ids", at::cat({prompt_ids, response_ids}, 1));
  at::Tensor attention_mask = at::cat({prompt_mask, response_mask}, 1);
  batch.set("attention_mask", attention_mask);
  batch.set("position_ids", (attention_mask.cumsum(1) - 1).clamp_min(0));
  batch.set("response_mask", response_mask);
  batch.set("rollout_log_probs", log_probs);
  batch.set("group_index", group);
  return batch;
}

std::vector<std::vector<int64_t>> split_by_rows(int64_t rows, int64_t rows_per_micro) {
  if (rows_per_micro < 1) throw ValueError(str("micro-batch size must be >= 1, got ", rows_per_micro));
  std::vector<std::vector<int64_t>> out;
  for (int64_t start = 0; start < rows; start += rows_per_micro) {
    std::vector<int64_t> part;
    for (int64_t r = start; r < std::min(rows, start + rows_per_micro); ++r) part.push_back(r);
    out.push_back(std::move(part));
  }
  return out;
}

std::vector<std::vector<int64_t>> split_by_tokens(const std::vector<int64_t>& lengths, int64_t max_tokens) {
  if (max_tokens < 1) throw ValueError(str("token budget must be >= 1, got ", max_tokens));
  std::vector<int64_t> order(lengths.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return lengths[a] > lengths[b]; });
  std::vector<std::vector<int64_t>> parts;
  std::vector<int64_t> load;
  for (int64_t r : order) {
    const int64_t len = lengths[static_cast<size_t>(r)];
    if (len > max_tokens)
      throw ValueError(str("a sequence of ", len, " tokens exceeds the micro-batch token budget of ", max_tokens,
                           " (raise ppo_max_token_len_per_gpu)"));
    // The least-loaded micro-batch that still fits, else a new one.
    int64_t best = -1;
    for (size_t p = 0; p < parts.size(); ++p)
      if (load[p] + len <= max_tokens && (best < 0 || load[p] < load[static_cast<size_t>(best)])) best = static_cast<int64_t>(p);
    if (best < 0) {
      parts.emplace_back();
      load.push_back(0);
      best = static_cast<int64_t>(parts.size()) - 1;
    }
    parts[static_cast<size_t>(best)].push_back(r);
    load[static_cast<size_t>(best)] += len;
  }
  for (auto& p : parts) std::sort(p.begin(), p.end());
  return parts;
}

}  // namespace rpg::rollout
