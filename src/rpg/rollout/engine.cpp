#include "rpg/rollout/engine.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <deque>

#include "rpg/core/error.h"
#include "rpg/core/rng.h"
#include "rpg/core/test_hook.h"
#include "rpg/model/causal_lm.h"

namespace rpg::rollout {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

struct Active {
  int64_t seq = 0;   // index into the output
  int64_t slot = 0;  // KV-cache slot
  RandomStream rng{0};
  Clock::time_point start;
};

}  // namespace

RolloutEngine::RolloutEngine(const model::CausalLM& model, EngineOptions options) : model_(model), options_(options) {
  if (options_.max_num_seqs < 1) throw ValueError(str("max_num_seqs: must be >= 1, got ", options_.max_num_seqs));
  if (options_.max_kv_tokens < 0) throw ValueError(str("max_kv_tokens: must be >= 0, got ", options_.max_kv_tokens));
}

void RolloutEngine::validate_request(const std::vector<std::vector<int64_t>>& prompts,
                                     const SamplingParams& params) const {
  params.validate();
  const auto& cfg = model_.config();
  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto& prompt = prompts[p];
    if (prompt.empty()) throw ValueError(str("prompt ", p, " is empty"));
    for (int64_t id : prompt)
      if (id < 0 || id >= cfg.vocab_size)
        throw ValueError(str("prompt ", p, ": token id ", id, " outside the vocabulary [0, ", cfg.vocab_size, ")"));
    const int64_t len = static_cast<int64_t>(prompt.size());
    if (cfg.max_position_embeddings > 0 && len + params.max_new_tokens > cfg.max_position_embeddings)
      throw ValueError(str("prompt ", p, " has ", len, " tokens; with max_new_tokens=", params.max_new_tokens,
                           " it exceeds the model context of ", cfg.max_position_embeddings, " tokens"));
  }
}

std::vector<Response> RolloutEngine::generate(const std::vector<std::vector<int64_t>>& prompts,
                                              const SamplingParams& params,
                                              const std::function<void(int64_t, int64_t)>& on_finished) {
  validate_request(prompts, params);
  int64_t max_prompt = 0;
  for (const auto& prompt : prompts) max_prompt = std::max(max_prompt, static_cast<int64_t>(prompt.size()));
  stats_ = {};
  const int64_t total = static_cast<int64_t>(prompts.size()) * params.n;
  std::vector<Response> out(static_cast<size_t>(total));
  if (total == 0) return out;

  const int64_t capacity = max_prompt + params.max_new_tokens;
  int64_t slots = std::min(options_.max_num_seqs, total);
  if (options_.max_kv_tokens > 0) {
    if (options_.max_kv_tokens < capacity)
      throw ValueError(str("max_kv_tokens=", options_.max_kv_tokens, " cannot hold one sequence of ", capacity,
                           " tokens (longest prompt + max_new_tokens)"));
    slots = std::min(slots, options_.max_kv_tokens / capacity);
  }

  c10::NoGradGuard no_grad;
  const auto t_start = Clock::now();
  model::KVCache cache = model_.new_cache(slots, capacity);
  std::vector<int64_t> free_slots;
  for (int64_t s = slots - 1; s >= 0; --s) free_slots.push_back(s);
  std::vector<Active> active;
  int64_t next_seq = 0, finished = 0;

  auto is_stop = [&](int64_t id) {
    return !params.ignore_eos &&
           std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), id) != params.stop_token_ids.end();
  };
  // Appends the sampled token of each active row; retires the rows that finished.
  auto take_tokens = [&](std::vector<Active>& rows, const at::Tensor& logits) {
    std::vector<double> uniforms;
    uniforms.reserve(rows.size());
    for (auto& a : rows) uniforms.push_back(params.temperature == 0.0 ? 0.0 : a.rng.uniform());
    SampledTokens sampled = sample_tokens(logits, params, uniforms);
    at::Tensor ids_t = sampled.ids.cpu();
    auto ids = ids_t.accessor<int64_t, 1>();
    at::Tensor lp_t = sampled.log_probs.cpu().contiguous();
    const float* lp = lp_t.data_ptr<float>();
    std::vector<Active> still;
    for (size_t i = 0; i < rows.size(); ++i) {
      Response& r = out[static_cast<size_t>(rows[i].seq)];
      r.token_ids.push_back(ids[static_cast<int64_t>(i)]);
      r.log_probs.push_back(lp[i]);
      ++stats_.generated_tokens;
      bool stop = is_stop(r.token_ids.back());
      if (stop || static_cast<int64_t>(r.token_ids.size()) >= params.max_new_tokens) {
        r.finish_reason = stop ? FinishReason::kStop : FinishReason::kLength;
        r.seconds = seconds_since(rows[i].start);
        cache.reset(rows[i].slot);
        free_slots.push_back(rows[i].slot);
        ++finished;
        if (on_finished) on_finished(finished, total);
      } else {
        still.push_back(rows[i]);
      }
    }
    rows.swap(still);
  };

  while (finished < total) {
    // Admit waiting sequences, a prompt group at a time: the prompt is prefilled once and
    // its cache copied to the group's other slots.
    while (!free_slots.empty() && next_seq < total) {
      const int64_t prompt_index = next_seq / params.n;
      std::vector<Active> group;
      while (!free_slots.empty() && next_seq < total && next_seq / params.n == prompt_index) {
        Active a;
        a.seq = next_seq;
        a.slot = free_slots.back();
        free_slots.pop_back();
        a.rng = RandomStream(mix_key(params.seed, params.prompt_index_offset + static_cast<uint64_t>(prompt_index),
                                     static_cast<uint64_t>(next_seq % params.n)));
        a.start = Clock::now();
        Response& r = out[static_cast<size_t>(next_seq)];
        r.prompt_index = prompt_index;
        r.sample_index = next_seq % params.n;
        group.push_back(a);
        ++next_seq;
      }
      const auto& prompt = prompts[static_cast<size_t>(prompt_index)];
      at::Tensor tokens = at::tensor(prompt, at::kLong).unsqueeze(0).to(model_.device());
      model::CausalLM::DecodeOptions prefill;
      prefill.last_only = true;  // only the last position's logits are sampled from
      at::Tensor logits = model_.decode(cache, {group[0].slot}, tokens, prefill);  // [1, V]
      stats_.prompt_tokens += static_cast<int64_t>(prompt.size());
      for (size_t i = 1; i < group.size(); ++i) cache.copy_slot(group[0].slot, group[i].slot);
      at::Tensor last = logits.expand({static_cast<int64_t>(group.size()), -1});
      take_tokens(group, last);
      active.insert(active.end(), group.begin(), group.end());
    }
    if (active.empty()) continue;
    // One decode step for every active sequence.
    std::vector<int64_t> slot_ids, last_tokens;
    for (const auto& a : active) {
      slot_ids.push_back(a.slot);
      last_tokens.push_back(out[static_cast<size_t>(a.seq)].token_ids.back());
    }
    at::Tensor tokens = at::tensor(last_tokens, at::kLong).unsqueeze(1).to(model_.device());
    at::Tensor logits = model_.decode(cache, slot_ids, tokens);  // [N, 1, V]
    take_tokens(active, logits.select(1, 0));
    test_hook::kill_point("generation");  // kill-and-resume tests die mid-generation here
  }
  stats_.seconds = seconds_since(t_start);
  return out;
}

}  // namespace rpg::rollout
