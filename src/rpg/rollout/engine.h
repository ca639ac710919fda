// The rollout engine: batched sampling with a KV cache and continuous batching, on the
// trainer's live weights (no weight copy or resharding, unlike a separate vLLM server).
//
// A fixed number of sequence slots decode together; a finished sequence's slot takes the
// next waiting one at once, so a batch never waits for its longest member. Each prompt's
// n responses are independent sequences with their own random stream
// (mix_key(seed, prompt index, sample index), position = token index), which makes the
// output identical for any slot count or batch composition.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "rpg/rollout/response.h"
#include "rpg/rollout/sampler.h"

namespace rpg::model {
class CausalLM;
}

namespace rpg::rollout {

struct EngineOptions {
  int64_t max_num_seqs = 64;   // sequence slots decoding together
  int64_t max_kv_tokens = 0;   // KV-cache budget in token positions over all slots (0: none)
  // The most (padded) prompt tokens one prefill forward takes: prompts admitted together are
  // prefilled in batches within it, and a longer prompt in chunks of this many tokens
  // (vLLM's max_num_batched_tokens with chunked prefill; verl's default 8192). It bounds a
  // prefill's activations; the responses do not depend on it beyond float rounding.
  int64_t max_num_batched_tokens = 8192;
  // > 0: the cache may also take at most this share of the memory available when generate()
  // starts (kv_budget_bytes); `memory_ranks` processes share a CPU's memory. rpg train's
  // actor_rollout_ref.rollout.kv_cache_memory_fraction, rpg generate / eval's
  // --kv-cache-memory-fraction. Like max_kv_tokens it only lowers the slot count: more
  // sequences wait their turn, and the responses do not depend on it.
  double kv_cache_memory_fraction = 0;
  int memory_ranks = 1;
  // Decode steps of fixed shape over every slot (model::CausalLM::decode_all_slots, sampling
  // on the device from a tensor of uniforms; idle slots computed and ignored), instead of a
  // step over the active rows only. The same tokens from the same streams; on a GPU the
  // launch count per token no longer depends on the batch, on a CPU it only costs more.
  bool fixed_slots = false;
  // fixed_slots, and the step captured in a CUDA graph per generate() and attention span
  // (GenerateStats::graphs_captured) and replayed: one launch and one host read (the stop
  // check) per token. CUDA with the plugin librpg_cuda.so only
  // (model::cuda_graphs_available()); the constructor refuses it elsewhere. verl's
  // actor_rollout_ref.rollout.enforce_eager=false.
  bool cuda_graph = false;
  // Each generate() packs the model's weights once for the CPU GEMM
  // (model::CausalLM::pack_weights_for_decode): fp32 CPU decode steps 1.1-1.7x faster for about
  // one copy of the weights while it runs. Off: MKL packs every weight on every call.
  bool pack_weights = true;
};

struct GenerateStats {
  int64_t prompt_tokens = 0;     // prefilled (a prompt shared by n samples counts once)
  int64_t prefill_forwards = 0;  // model calls that prefilled them (prompts admitted together share one; a
                                 // prompt past max_num_batched_tokens takes one per chunk)
  int64_t generated_tokens = 0;
  int64_t slots = 0;             // sequences that decoded together (at most max_num_seqs)
  bool slots_cut_by_kv_budget = false;  // a KV budget allowed fewer than max_num_seqs
  double seconds = 0.0;
  // The decode steps alone (admission and prefill excluded): a step's cost at the shapes it
  // ran, for benchmarks that must not subtract two noisy runs.
  double decode_seconds = 0.0;
  int64_t decode_steps = 0;
  // Fixed-slot steps (EngineOptions::fixed_slots / cuda_graph): the cache positions their
  // attention spanned, summed over steps (each step the smallest of a few spans that holds
  // every write position, not the whole capacity), and the CUDA graphs captured (one per span
  // a step needed).
  int64_t attended_positions = 0;
  int64_t graphs_captured = 0;
  double tokens_per_second() const { return seconds > 0 ? static_cast<double>(generated_tokens) / seconds : 0.0; }
};

// What options.kv_cache_memory_fraction allows the KV cache now, in bytes: that share of the
// memory available on the model's device (CPU: MemAvailable / memory_ranks, less the copy of
// the weights generate() packs when pack_weights; CUDA: the device's free memory plus what
// torch's caching allocator holds unused). nullopt when the fraction is 0 or the memory cannot
// be read.
std::optional<int64_t> kv_budget_bytes(const model::CausalLM& model, const EngineOptions& options);

class RolloutEngine {
 public:
  RolloutEngine(const model::CausalLM& model, EngineOptions options = {});

  // n responses for each prompt (token ids), ordered by (prompt, sample). `on_finished`
  // is called after each finished response with (finished, total). Throws ValueError for
  // invalid parameters, an empty prompt, or a prompt that does not fit the context.
  std::vector<Response> generate(const std::vector<std::vector<int64_t>>& prompts, const SamplingParams& params,
                                 const std::function<void(int64_t, int64_t)>& on_finished = {});
  const GenerateStats& last_stats() const { return stats_; }
  // The checks generate() starts with, for callers that want errors before other work.
  void validate_request(const std::vector<std::vector<int64_t>>& prompts, const SamplingParams& params) const;

 private:
  const model::CausalLM& model_;
  EngineOptions options_;
  GenerateStats stats_;
};

}  // namespace rpg::rollout
