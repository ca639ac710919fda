// One generated response, as the rollout engine returns it.
#pragma once

#include <cstdint>
#include <vector>

namespace rpg::rollout {

enum class FinishReason { kStop, kLength };
inline const char* finish_reason_name(FinishReason r) { return r == FinishReason::kStop ? "stop" : "length"; }

struct Response {
  int64_t prompt_index = 0;  // position of the prompt in the input
  int64_t sample_index = 0;  // 0..n-1
  std::vector<int64_t> token_ids;  // generated tokens, the stop token included
  std::vector<float> log_probs;    // per generated token, see SampledTokens::log_probs
  FinishReason finish_reason = FinishReason::kLength;
  double seconds = 0.0;            // from admission to the last token
};

}  // namespace rpg::rollout
