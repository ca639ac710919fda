// Next-token sampling: temperature, top-k, top-p, greedy. Each row draws with one uniform
// number given by the caller (from that sequence's own random stream), by inverting the
// CDF of the filtered distribution in token-id order, so a row's token depends only on its
// logits and its uniform, never on which other rows share the batch.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <vector>

namespace rpg::rollout {

struct SamplingParams {
  double temperature = 1.0;  // 0: greedy (argmax)
  double top_p = 1.0;        // nucleus mass in (0, 1]
  int64_t top_k = -1;        // keep the k most likely tokens; -1: all
  int64_t max_new_tokens = 512;
  std::vector<int64_t> stop_token_ids;  // EOS and any extra stop ids
  int64_t n = 1;                        // responses per prompt
  uint64_t seed = 0;
  // Added to a prompt's position in the random-stream key (not to Response::prompt_index):
  // a data-parallel rank generating prompts [b, e) of a batch passes b, so its responses are
  // those of a one-process run over the whole batch.
  uint64_t prompt_index_offset = 0;
  bool ignore_eos = false;  // keep generating through stop tokens
  // Throws ValueError naming the field for any value out of range.
  void validate() const;
};

// The distribution a row is sampled from: softmax(logits / T) restricted to the top-k
// tokens, then to the smallest most-likely set with mass >= top_p, renormalised.
// logits [N, V] -> probabilities [N, V] float64. Not for greedy (T = 0).
at::Tensor sampling_probs(const at::Tensor& logits, const SamplingParams& params);

struct SampledTokens {
  at::Tensor ids;        // [N] int64
  at::Tensor log_probs;  // [N] fp32: log softmax(logits / T) at the token, the unfiltered
                         // distribution, which is what verl's old_log_probs recompute
};

// logits [N, V]; uniforms: N numbers in [0, 1). Greedy when temperature == 0 (uniforms
// unused; log-probs at T = 1).
SampledTokens sample_tokens(const at::Tensor& logits, const SamplingParams& params, const std::vector<double>& uniforms);
// The same with the uniforms as a float64 [N] tensor on the logits' device: fixed shapes, no
// host read (what a step captured in a CUDA graph needs).
SampledTokens sample_tokens_on_device(const at::Tensor& logits, const SamplingParams& params, const at::Tensor& uniforms);

}  // namespace rpg::rollout
