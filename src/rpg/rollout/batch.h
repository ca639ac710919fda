// Batch: the container every stage of an RL step reads and writes (verl's DataProto).
// Named tensors that share their first dimension (rows) plus per-row strings. Stages add
// keys; they never reshape another stage's keys.
//
// The verl layout built by make_rollout_batch (B rows, P prompt, R response positions):
//   prompts        [B, P]   left-padded prompt ids
//   responses      [B, R]   right-padded generated ids
//   input_ids      [B, P+R] prompts | responses
//   attention_mask [B, P+R] 1 on real prompt tokens and on response tokens up to EOS
//   position_ids   [B, P+R] cumsum(attention_mask) - 1, clamped at 0
//   response_mask  [B, R]   1 on generated tokens up to and including EOS
//   rollout_log_probs [B, R] fp32, log-probs of the sampling distribution (0 on padding)
//   group_index    [B]      prompt index: rows of one prompt form a group
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rpg::rollout {

struct Response;

class Batch {
 public:
  int64_t rows() const { return rows_; }
  bool has(const std::string& key) const;
  // Throws ValueError naming the key and the keys present.
  const at::Tensor& get(const std::string& key) const;
  // Throws ValueError when the first dimension differs from the other keys'.
  void set(const std::string& key, at::Tensor value);
  const std::vector<std::string>& strings(const std::string& key) const;
  void set_strings(const std::string& key, std::vector<std::string> values);
  std::vector<std::string> keys() const;

  // Rows in the given order (repeats allowed).
  Batch select(const std::vector<int64_t>& rows) const;
  // Rows of all parts, in order. Every part must have the same keys.
  static Batch concat(const std::vector<Batch>& parts);

 private:
  void check_rows(const std::string& key, int64_t n);
  int64_t rows_ = -1;  // -1 until the first key is set
  std::map<std::string, at::Tensor> tensors_;
  std::map<std::string, std::vector<std::string>> strings_;
};

// The verl layout for prompts and their responses (one row per response, in order).
// P and R are the longest prompt and response of the batch, or the given minimums if
// larger (to keep shapes fixed across steps).
Batch make_rollout_batch(const std::vector<std::vector<int64_t>>& prompts, const std::vector<Response>& responses,
                         int64_t pad_token_id, int64_t min_prompt_length = 0, int64_t min_response_length = 0);

// Consecutive micro-batches of at most `rows_per_micro` rows each.
std::vector<std::vector<int64_t>> split_by_rows(int64_t rows, int64_t rows_per_micro);
// Micro-batches whose summed `lengths` stay within `max_tokens` (verl's use_dynamic_bsz):
// longest rows first, each to the least-loaded micro-batch it fits in. Rows keep their
// relative order inside a micro-batch. Throws ValueError when one row alone exceeds the budget.
std::vector<std::vector<int64_t>> split_by_tokens(const std::vector<int64_t>& lengths, int64_t max_tokens);

}  // namespace rpg::rollout
