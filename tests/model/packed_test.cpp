// Padding-free (packed) forward against the padded path and against each sequence run
// alone: the padded forward is itself checked against transformers (hf_parity_test), and a
// sequence alone needs no mask at all, so neither oracle shares the packing code.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <utility>
#include <vector>

#include "model_test_util.h"
#include "rpg/core/error.h"
#include "rpg/model/causal_lm.h"

namespace rpg::model {
namespace {

double max_abs(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

// Each sequence of the stream gets the hidden states it gets when run alone, whatever its
// neighbours (lengths 1..7, so one-token sequences too), with positions restarting at 0.
TEST(PackedForward, EachSequenceSeesOnlyItself) {
  for (const char* type : {"qwen2", "qwen3"}) {
    CausalLM m = test::random_model(type);
    at::NoGradGuard no_grad;
    std::vector<int64_t> lens = {3, 1, 7, 2, 5, 1, 4, 6};
    int64_t N = 0;
    for (int64_t L : lens) N += L;
    at::manual_seed(3);
    at::Tensor ids = at::randint(1, m.config().vocab_size, {N}, at::kLong);
    std::vector<at::Tensor> pos;
    for (int64_t L : lens) pos.push_back(at::arange(L, at::kLong));
    at::Tensor h = m.packed_hidden_states(ids, at::cat(pos), lens);
    ASSERT_EQ(h.sizes(), (std::vector<int64_t>{N, m.config().hidden_size}));
    int64_t off = 0;
    for (int64_t L : lens) {
      at::Tensor alone = m.hidden_states(ids.narrow(0, off, L).unsqueeze(0)).squeeze(0);
      EXPECT_LT(max_abs(h.narrow(0, off, L), alone), 1e-5) << type << " sequence at " << off << " of length " << L;
      off += L;
    }
  }
}

// verl's layout: prompts left-padded to P, responses right-padded to R. Row i has prompt
// and response lengths giving total lengths 1..P+R: a row with no response token, rows
// with exactly one, and a full row.
struct Batch {
  at::Tensor input_ids, attention_mask, targets, response_mask;
};
Batch mixed_batch(int64_t vocab) {
  const int64_t P = 7, R = 6, T = P + R;
  std::vector<std::pair<int64_t, int64_t>> rows;  // (prompt, response)
  for (int64_t total = 1; total <= T; ++total) rows.emplace_back((total + 1) / 2, total / 2);
  const int64_t B = static_cast<int64_t>(rows.size());
  Batch b;
  at::manual_seed(11);
  b.input_ids = at::randint(1, vocab, {B, T}, at::kLong);
  b.attention_mask = at::zeros({B, T}, at::kLong);
  b.response_mask = at::zeros({B, R}, at::kLong);
  for (int64_t i = 0; i < B; ++i) {
    auto [p, r] = rows[i];
    b.attention_mask[i].narrow(0, P - p, p + r).fill_(1);
    if (r > 0) b.response_mask[i].narrow(0, 0, r).fill_(1);
  }
  b.input_ids.mul_(b.attention_mask);
  b.targets = b.input_ids.narrow(1, P, R);
  return b;
}

struct Result {
  at::Tensor log_probs, entropy, loss;
  std::vector<at::Tensor> grads;
};

// A policy-gradient-shaped loss over response tokens: sum(mask * (w1 * log p + w2 * H)) / n.
Result run(const CausalLM& m, const Batch& b, bool remove_padding) {
  LogProbOptions o;
  o.temperature = 0.7;
  o.with_entropy = true;
  o.chunk_tokens = 5;
  o.remove_padding = remove_padding;
  TokenLogProbs t = m.log_probs(b.input_ids, b.attention_mask, {}, b.targets, o);
  at::manual_seed(5);
  at::Tensor w1 = at::randn(t.log_probs.sizes()), w2 = at::randn(t.log_probs.sizes());
  at::Tensor mask = b.response_mask.to(at::kFloat);
  Result r;
  r.loss = (mask * (w1 * t.log_probs + 0.1 * w2 * t.entropy)).sum() / mask.sum();
  r.grads = torch::autograd::grad({r.loss}, m.parameters());
  r.log_probs = t.log_probs.detach();
  r.entropy = t.entropy.detach();
  return r;
}

void expect_packed_equals_padded(const CausalLM& m, const std::string& what) {
  Batch b = mixed_batch(m.config().vocab_size);
  Result padded = run(m, b, false), packed = run(m, b, true);
  at::Tensor mask = b.response_mask.to(at::kBool);
  EXPECT_LT(test::max_abs_diff_masked(padded.log_probs, packed.log_probs, mask), 1e-5) << what;
  EXPECT_LT(test::max_abs_diff_masked(padded.entropy, packed.entropy, mask), 1e-5) << what;
  // Positions that score no real target are 0 in the packed result.
  EXPECT_EQ(packed.log_probs.masked_select(mask.logical_not()).abs().max().item<double>(), 0.0) << what;
  EXPECT_LT(std::abs(padded.loss.item<double>() - packed.loss.item<double>()), 1e-5) << what;
  auto names = m.named_parameters();
  ASSERT_EQ(padded.grads.size(), packed.grads.size());
  for (size_t i = 0; i < padded.grads.size(); ++i) {
    ASSERT_TRUE(padded.grads[i].defined() && packed.grads[i].defined()) << what << " " << names[i].first;
    EXPECT_GT(padded.grads[i].abs().max().item<double>(), 0.0) << what << " " << names[i].first;
    EXPECT_LT(max_abs(padded.grads[i], packed.grads[i]), 1e-5) << what << " " << names[i].first;
  }
}

TEST(PackedLogProbs, LogProbsEntropyLossAndGradientsEqualThePaddedPath) {
  expect_packed_equals_padded(test::random_model("qwen2"), "qwen2 (GQA, qkv bias)");
  expect_packed_equals_padded(test::random_model("qwen3"), "qwen3 (qk norm)");
  expect_packed_equals_padded(test::random_model("llama", at::kFloat, R"("tie_word_embeddings": true)"),
                              "llama (llama3 RoPE, tied)");
}

TEST(PackedLogProbs, EqualThePaddedPathUnderGradientCheckpointing) {
  CausalLM m = test::random_model("qwen2");
  m.set_gradient_checkpointing(true);
  expect_packed_equals_padded(m, "qwen2 checkpointed");
}

// Without an attention mask every row is one full sequence; packing still restarts
// positions and attention per row.
TEST(PackedLogProbs, NoMaskMeansFullRows) {
  CausalLM m = test::random_model("qwen2");
  at::NoGradGuard no_grad;
  at::manual_seed(7);
  at::Tensor ids = at::randint(1, m.config().vocab_size, {3, 9}, at::kLong);
  LogProbOptions o;
  o.with_entropy = true;
  TokenLogProbs padded = m.log_probs(ids, {}, {}, ids.narrow(1, 4, 5), o);
  o.remove_padding = true;
  TokenLogProbs packed = m.log_probs(ids, {}, {}, ids.narrow(1, 4, 5), o);
  EXPECT_LT(max_abs(padded.log_probs, packed.log_probs), 1e-5);
  EXPECT_LT(max_abs(padded.entropy, packed.entropy), 1e-5);
}

TEST(PackedForward, BadLengthsThrow) {
  CausalLM m = test::random_model("qwen2");
  at::Tensor ids = at::ones({5}, at::kLong), pos = at::arange(5, at::kLong);
  EXPECT_THROW(m.packed_hidden_states(ids, pos, {2, 2}), ValueError);
  EXPECT_THROW(m.packed_hidden_states(ids, pos, {5, 0}), ValueError);
  EXPECT_THROW(m.packed_hidden_states(ids.view({1, 5}), pos.view({1, 5}), {5}), c10::Error);
}

}  // namespace
}  // namespace rpg::model
