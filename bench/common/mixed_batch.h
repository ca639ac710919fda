// A mixed-length training micro-batch in verl's layout (prompts left-padded to the longest
// prompt, responses right-padded to the longest response), for the padded-vs-packed
// benchmarks (bench/packed/packed_bench.cpp on the CPU, bench/gpu/gpu_bench.cpp --what packed).
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>

namespace rpg::bench {

struct MixedBatch {
  at::Tensor ids;            // [rows, T] int64, zero where padded
  at::Tensor attention_mask; // [rows, T] int64
  at::Tensor targets;        // [rows, R] the response tokens
  at::Tensor response_mask;  // [rows, R] float
  int64_t width = 0;         // T = longest prompt + longest response
  int64_t real_tokens = 0, response_tokens = 0;
};

// Row lengths uniform in [min_len, max_len] (torch's global generator), a quarter of each
// row prompt and the rest response; token ids uniform in [1, vocab). On the CPU.
inline MixedBatch mixed_batch(int64_t rows, int64_t min_len, int64_t max_len, int64_t vocab) {
  MixedBatch b;
  std::vector<int64_t> prompt(static_cast<size_t>(rows)), response(static_cast<size_t>(rows));
  int64_t P = 0, R = 0;
  at::Tensor u = at::randint(min_len, max_len + 1, {rows}, at::kLong);
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t len = u[i].item<int64_t>();
    const auto k = static_cast<size_t>(i);
    prompt[k] = std::max<int64_t>(1, len / 4);
    response[k] = len - prompt[k];
    P = std::max(P, prompt[k]);
    R = std::max(R, response[k]);
    b.real_tokens += len;
    b.response_tokens += response[k];
  }
  b.width = P + R;
  b.attention_mask = at::zeros({rows, b.width}, at::kLong);
  b.response_mask = at::zeros({rows, R}, at::kFloat);
  for (int64_t i = 0; i < rows; ++i) {
    const auto k = static_cast<size_t>(i);
    b.attention_mask[i].narrow(0, P - prompt[k], prompt[k] + response[k]).fill_(1);
    b.response_mask[i].narrow(0, 0, response[k]).fill_(1);
  }
  b.ids = at::randint(1, vocab, {rows, b.width}, at::kLong).mul_(b.attention_mask);
  b.targets = b.ids.narrow(1, P, R);
  return b;
}

}  // namespace rpg::bench
