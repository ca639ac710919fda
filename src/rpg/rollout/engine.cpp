#include "rpg/rollout/engine.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <chrono>
#include <deque>
#include <memory>
#include <optional>

#include "rpg/core/device.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/rng.h"
#include "rpg/core/test_hook.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/cuda_graph.h"

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

// Rows admitted together that share one prompt (its prefill is computed once).
struct Admitted {
  int64_t prompt_index = 0;
  std::vector<Active> rows;
};

// Sampled ids [N] int64 and log-probs [N] fp32 as one byte buffer ids-then-log-probs, and
// views of its two parts: both come to the host in one copy (on CUDA one wait per step,
// not two).
struct Sampled {
  at::Tensor bytes, ids, lps;
  explicit Sampled(at::Tensor b) : bytes(std::move(b)) {
    const int64_t n = bytes.numel() / 12;
    ids = bytes.narrow(0, 0, 8 * n).view(at::kLong);
    lps = bytes.narrow(0, 8 * n, 4 * n).view(at::kFloat);
  }
  static Sampled to_host(const SampledTokens& s) {
    return Sampled(at::cat({s.ids.contiguous().view(at::kByte), s.log_probs.contiguous().view(at::kByte)}).cpu());
  }
};

// The spans of cache positions a fixed-slot step attends: the capacity and its halvings down
// to a sixteenth, in multiples of 8. A step takes the smallest that holds every slot's write
// position, so past the smallest it attends at most about twice the positions its longest
// sequence has, not the whole capacity; one CUDA graph per span.
std::vector<int64_t> attention_spans(int64_t capacity) {
  std::vector<int64_t> spans;
  for (int64_t part = 16; part >= 1; part /= 2) {
    const int64_t span = std::min(capacity, (capacity / part + 7) / 8 * 8);
    if (spans.empty() || span > spans.back()) spans.push_back(span);
  }
  return spans;
}

// The device side of fixed-slot decoding: every slot's input token and write position, a
// uniform per slot, and the sampled token and log-prob per slot, at fixed addresses (a
// captured graph reads and writes them), plus host staging copies (pinned on CUDA).
struct FixedSlots {
  at::Tensor tok, pos, uni;            // device: [S, 1] int64, [S] int64, [S] f64
  at::Tensor tok_h, pos_h, uni_h;      // host
  Sampled out, out_h;                  // device, host: [S] ids and log-probs
  std::vector<int64_t> spans;          // attention_spans(capacity)
  std::vector<std::unique_ptr<model::StepGraph>> graphs;  // per span, captured when first needed

  FixedSlots(int64_t slots, int64_t capacity, at::Device device)
      : out(at::zeros({12 * slots}, at::TensorOptions().dtype(at::kByte).device(device))),
        out_h(at::zeros({12 * slots}, at::TensorOptions().dtype(at::kByte).pinned_memory(device.is_cuda()))),
        spans(attention_spans(capacity)),
        graphs(spans.size()) {
    auto host = at::TensorOptions().pinned_memory(device.is_cuda());
    tok_h = at::zeros({slots, 1}, host.dtype(at::kLong));
    pos_h = at::zeros({slots}, host.dtype(at::kLong));
    uni_h = at::zeros({slots}, host.dtype(at::kDouble));
    tok = tok_h.to(device);
    pos = pos_h.to(device);
    uni = uni_h.to(device);
  }
};

}  // namespace

std::optional<int64_t> kv_budget_bytes(const model::CausalLM& model, const EngineOptions& options) {
  if (options.kv_cache_memory_fraction <= 0) return std::nullopt;
  const bool cuda = model.device().is_cuda();
  const auto avail = device::available_memory(cuda, cuda ? model.device().index() : 0);
  if (!avail) return std::nullopt;
  double packs = 0;  // generate() packs them before it allocates the cache
  if (!cuda && options.pack_weights)
    for (const auto& p : model.parameters()) packs += static_cast<double>(p.numel() * p.element_size());
  const double free_bytes =
      std::max(0.0, static_cast<double>(*avail) / std::max(1, cuda ? 1 : options.memory_ranks) - packs);
  return static_cast<int64_t>(options.kv_cache_memory_fraction * free_bytes);
}

RolloutEngine::RolloutEngine(const model::CausalLM& model, EngineOptions options) : model_(model), options_(options) {
  if (options_.max_num_seqs < 1) throw ValueError(str("max_num_seqs: must be >= 1, got ", options_.max_num_seqs));
  if (options_.max_kv_tokens < 0) throw ValueError(str("max_kv_tokens: must be >= 0, got ", options_.max_kv_tokens));
  if (options_.max_num_batched_tokens < 1)
    throw ValueError(str("max_num_batched_tokens: must be >= 1, got ", options_.max_num_batched_tokens));
  if (!(options_.kv_cache_memory_fraction >= 0 && options_.kv_cache_memory_fraction <= 1))
    throw ValueError(str("kv_cache_memory_fraction: must be in [0, 1], got ", options_.kv_cache_memory_fraction));
  if (options_.cuda_graph && !(model_.device().is_cuda() && model::cuda_graphs_available()))
    throw ValueError(str("cuda_graph: needs a model on CUDA and the CUDA plugin librpg_cuda.so (model on ",
                         model_.device().str(), model_.device().is_cuda() ? ", plugin not loaded" : "", ")"));
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
  if (const auto budget = kv_budget_bytes(model_, options_)) {
    const int64_t per_sequence = model_.kv_cache_bytes_per_sequence(capacity);
    if (*budget < per_sequence)
      throw ValueError(str("kv_cache_memory_fraction=", options_.kv_cache_memory_fraction, " of the available memory: ",
                           format_bytes(static_cast<double>(*budget)), " cannot hold one sequence of ", capacity,
                           " tokens (longest prompt + max_new_tokens: ", format_bytes(static_cast<double>(per_sequence)),
                           ")"));
    slots = std::min(slots, *budget / per_sequence);
  }
  stats_.slots = slots;
  stats_.slots_cut_by_kv_budget = slots < std::min(options_.max_num_seqs, total);

  c10::NoGradGuard no_grad;
  const auto t_start = Clock::now();
  // The weights do not change during a rollout: packed once for the CPU GEMM (a no-op elsewhere).
  const model::CausalLM::DecodePacks packs =
      options_.pack_weights ? model_.pack_weights_for_decode() : model::CausalLM::DecodePacks{};
  model::KVCache cache = model_.new_cache(slots, capacity);
  std::vector<int64_t> free_slots;
  for (int64_t s = slots - 1; s >= 0; --s) free_slots.push_back(s);
  std::vector<Active> active;
  int64_t next_seq = 0, finished = 0;

  auto is_stop = [&](int64_t id) {
    return !params.ignore_eos &&
           std::find(params.stop_token_ids.begin(), params.stop_token_ids.end(), id) != params.stop_token_ids.end();
  };
  // Fixed-slot decoding: where each slot's next token is written (its prompt, then one more
  // position per step); decode_all_slots keeps no lengths of its own.
  std::optional<FixedSlots> fixed;
  std::vector<int64_t> next_position(static_cast<size_t>(slots), 0);
  auto fixed_step = [&](int64_t span) {
    at::Tensor logits = model_.decode_all_slots(cache, fixed->tok, fixed->pos, span).select(1, 0);  // [S, V]
    SampledTokens s = sample_tokens_on_device(logits, params, fixed->uni);
    fixed->out.ids.copy_(s.ids);
    fixed->out.lps.copy_(s.log_probs);
  };
  if (options_.fixed_slots || options_.cuda_graph) fixed.emplace(slots, capacity, model_.device());
  // Appends each row's sampled token (ids / lp indexed like `rows`, or by slot when
  // `by_slot`); retires the rows that finished.
  auto append_tokens = [&](std::vector<Active>& rows, const int64_t* ids, const float* lp, bool by_slot) {
    std::vector<Active> still;
    for (size_t i = 0; i < rows.size(); ++i) {
      const size_t k = by_slot ? static_cast<size_t>(rows[i].slot) : i;
      Response& r = out[static_cast<size_t>(rows[i].seq)];
      r.token_ids.push_back(ids[k]);
      r.log_probs.push_back(lp[k]);
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
        next_position[static_cast<size_t>(rows[i].slot)] =
            static_cast<int64_t>(prompts[static_cast<size_t>(r.prompt_index)].size() + r.token_ids.size()) - 1;
      }
    }
    rows.swap(still);
  };
  // Samples each row's token from its logits row (eager) and appends it.
  auto take_tokens = [&](std::vector<Active>& rows, const at::Tensor& logits) {
    std::vector<double> uniforms;
    uniforms.reserve(rows.size());
    for (auto& a : rows) uniforms.push_back(params.temperature == 0.0 ? 0.0 : a.rng.uniform());
    const Sampled sampled = Sampled::to_host(sample_tokens(logits, params, uniforms));
    append_tokens(rows, sampled.ids.data_ptr<int64_t>(), sampled.lps.data_ptr<float>(), false);
  };

  // Prefills the admitted groups' prompts, each once into its group's first slot, copies it to
  // the group's other slots and samples each row's first token. The prompts go through
  // together, shortest first, in right-padded batches (one forward each instead of one per
  // prompt: on a GPU every forward of a small model costs a few hundred kernel launches
  // whatever its length) whose padding stays within a quarter of their real tokens and whose
  // padded size within max_num_batched_tokens. A longer prompt goes alone, in chunks of that
  // many tokens, each attending the ones before it in the cache (vLLM's chunked prefill): the
  // activations of one forward stay within that budget whatever the prompt. On the CPU the
  // packed products are as fast at one prompt's rows as at more, and MKL's unpacked GEMM
  // beyond them is slower: there a batch stays within the rows the packs take.
  const int64_t budget = options_.max_num_batched_tokens;
  const int64_t prefill_tokens = packs.max_rows() > 0 ? std::min(packs.max_rows(), budget) : budget;
  auto prefill = [&](std::vector<Admitted>& groups) {
    auto length = [&](size_t g) { return static_cast<int64_t>(prompts[static_cast<size_t>(groups[g].prompt_index)].size()); };
    std::vector<size_t> order(groups.size());
    for (size_t g = 0; g < order.size(); ++g) order[g] = g;
    std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return length(a) < length(b); });
    for (size_t first = 0, end = 0; first < order.size(); first = end) {
      int64_t real = length(order[first]);
      for (end = first + 1; end < order.size(); ++end) {
        const int64_t len = length(order[end]), padded = static_cast<int64_t>(end - first + 1) * len;
        if (padded > prefill_tokens || 4 * padded > 5 * (real + len)) break;
        real += len;
      }
      const int64_t rows = static_cast<int64_t>(end - first), T = length(order[end - 1]);
      at::Tensor tokens = at::zeros({rows, T}, at::kLong);
      std::vector<int64_t> slots, lengths;
      for (int64_t r = 0; r < rows; ++r) {
        const Admitted& g = groups[order[first + static_cast<size_t>(r)]];
        const auto& prompt = prompts[static_cast<size_t>(g.prompt_index)];
        std::copy(prompt.begin(), prompt.end(), tokens.data_ptr<int64_t>() + r * T);
        slots.push_back(g.rows[0].slot);
        lengths.push_back(static_cast<int64_t>(prompt.size()));
        stats_.prompt_tokens += static_cast<int64_t>(prompt.size());
      }
      // Only each row's last real position's logits are sampled from: [rows, V].
      at::Tensor logits;
      for (int64_t done = 0; done < T; done += budget) {  // one pass unless a lone prompt exceeds the budget
        const int64_t chunk = std::min(budget, T - done);
        logits = model_.decode(cache, slots, tokens.narrow(1, done, chunk).to(model_.device()),
                               {chunk == T ? lengths : std::vector<int64_t>{}, true});
        ++stats_.prefill_forwards;
      }
      for (int64_t r = 0; r < rows; ++r) {
        std::vector<Active>& group = groups[order[first + static_cast<size_t>(r)]].rows;
        for (size_t i = 1; i < group.size(); ++i) cache.copy_slot(group[0].slot, group[i].slot);
        take_tokens(group, logits.narrow(0, r, 1).expand({static_cast<int64_t>(group.size()), -1}));
        active.insert(active.end(), group.begin(), group.end());
      }
    }
  };

  while (finished < total) {
    // Admit waiting sequences while slots are free, a prompt group (or what of it fits) at a time.
    std::vector<Admitted> admitted;
    while (!free_slots.empty() && next_seq < total) {
      Admitted& g = admitted.emplace_back();
      g.prompt_index = next_seq / params.n;
      while (!free_slots.empty() && next_seq < total && next_seq / params.n == g.prompt_index) {
        Active a;
        a.seq = next_seq;
        a.slot = free_slots.back();
        free_slots.pop_back();
        a.rng = RandomStream(mix_key(params.seed, params.prompt_index_offset + static_cast<uint64_t>(g.prompt_index),
                                     static_cast<uint64_t>(next_seq % params.n)));
        a.start = Clock::now();
        Response& r = out[static_cast<size_t>(next_seq)];
        r.prompt_index = g.prompt_index;
        r.sample_index = next_seq % params.n;
        g.rows.push_back(a);
        ++next_seq;
      }
    }
    prefill(admitted);
    if (active.empty()) continue;
    const auto t_step = Clock::now();
    ++stats_.decode_steps;
    if (fixed) {
      // One step of every slot: idle ones read token 0 at position 0 (their next prefill
      // overwrites it). Inputs staged on the host, copied in, then the one host read.
      FixedSlots& f = *fixed;
      f.tok_h.zero_();
      f.pos_h.zero_();
      f.uni_h.zero_();
      int64_t* tok = f.tok_h.data_ptr<int64_t>();
      int64_t* pos = f.pos_h.data_ptr<int64_t>();
      double* uni = f.uni_h.data_ptr<double>();
      int64_t needed = 1;  // positions the step must attend: up to the furthest write
      for (auto& a : active) {
        tok[a.slot] = out[static_cast<size_t>(a.seq)].token_ids.back();
        pos[a.slot] = next_position[static_cast<size_t>(a.slot)];
        uni[a.slot] = params.temperature == 0.0 ? 0.0 : a.rng.uniform();
        needed = std::max(needed, pos[a.slot] + 1);
      }
      const size_t span = static_cast<size_t>(
          std::lower_bound(f.spans.begin(), f.spans.end(), needed) - f.spans.begin());
      stats_.attended_positions += f.spans[span];
      f.tok.copy_(f.tok_h, /*non_blocking=*/true);
      f.pos.copy_(f.pos_h, /*non_blocking=*/true);
      f.uni.copy_(f.uni_h, /*non_blocking=*/true);
      if (options_.cuda_graph) {
        std::unique_ptr<model::StepGraph>& graph = f.graphs[span];
        if (!graph) {
          // Captured when a step first needs this span. The capture's warm-up runs the step
          // for real on these inputs, writing what the replay below writes again. All spans'
          // graphs share one memory pool: they replay one at a time, from and to f's tensors.
          const model::StepGraph* pool = nullptr;
          for (const auto& g : f.graphs)
            if (g && !pool) pool = g.get();
          graph = model::capture_cuda_graph([&fixed_step, s = f.spans[span]] { fixed_step(s); }, pool);
          ++stats_.graphs_captured;
        }
        graph->replay();
      } else {
        fixed_step(f.spans[span]);
      }
      f.out_h.bytes.copy_(f.out.bytes);  // the one host read
      append_tokens(active, f.out_h.ids.data_ptr<int64_t>(), f.out_h.lps.data_ptr<float>(), true);
      stats_.decode_seconds += seconds_since(t_step);
      test_hook::kill_point("generation");
      continue;
    }
    // One decode step for every active sequence.
    std::vector<int64_t> slot_ids, last_tokens;
    for (const auto& a : active) {
      slot_ids.push_back(a.slot);
      last_tokens.push_back(out[static_cast<size_t>(a.seq)].token_ids.back());
    }
    at::Tensor tokens = at::tensor(last_tokens, at::kLong).unsqueeze(1).to(model_.device());
    at::Tensor logits = model_.decode(cache, slot_ids, tokens);  // [N, 1, V]
    take_tokens(active, logits.select(1, 0));
    stats_.decode_seconds += seconds_since(t_step);
    test_hook::kill_point("generation");  // kill-and-resume tests die mid-generation here
  }
  stats_.seconds = seconds_since(t_start);
  return out;
}

}  // namespace rpg::rollout
