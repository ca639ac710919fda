// Padding-free (packed) forward against the padded path and against each sequence run
// alone: the padded forward is itself checked against transformers (hf_parity_test), and a
// sequence alone needs no mask at all, so neither oracle shares the packing code.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>
#include <vector>

#include "model_test_util.h"
#include "rpg/core/error.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/layer.h"

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

// attend()'s mask-free form for padded rows (AttnInputs::key_start) against softmax attention
// written out in fp64: query t of T sits at key position S - T + t and sees its row's keys
// from the row's first real one up to itself; a query before that gets 0. Values and the
// gradients of q, k and v; rows sharing one start (a narrow) and rows with their own (a
// gather); T = S and T < S; grouped and plain heads; a row with no real key at all.
TEST(KeyStartAttention, EqualsSoftmaxOverEachQuerysRealKeys) {
  struct Case {
    int64_t T, S, H, Hkv;
    std::vector<int64_t> starts;
  };
  const std::vector<Case> cases = {
      {7, 7, 6, 2, {0, 3, 5, 1}},       // a padded batch, full forward: queries before the start get 0
      {7, 7, 6, 2, {2, 2, 2}},          // one start for every row
      {5, 12, 6, 2, {0, 4, 7, 12}},     // a suffix over prefix keys; the last row has no real key
      {5, 12, 4, 4, {3, 3}},            // zero queries in front, plain multi-head
      {9, 11, 6, 3, {0, 0, 5}},         // starts past S - T: the first queries have no key
      {1, 40, 6, 2, {0, 39, 17}},       // one query per row
  };
  for (const Case& k : cases) {
    const int64_t B = static_cast<int64_t>(k.starts.size()), D = 8;
    SCOPED_TRACE(testing::Message() << "T " << k.T << " S " << k.S << " H " << k.H << "/" << k.Hkv << " B " << B);
    ModelConfig c = ModelConfig::from_json(test::tiny_config_json("qwen2", ""), "test config");
    c.num_attention_heads = k.H, c.num_key_value_heads = k.Hkv, c.head_dim = D;
    at::manual_seed(static_cast<uint64_t>(k.T * 100 + k.S));
    at::Tensor q = at::randn({B, k.T, k.H, D}, at::kDouble), kk = at::randn({B, k.S, k.Hkv, D}, at::kDouble),
               v = at::randn({B, k.S, k.Hkv, D}, at::kDouble), w = at::randn({B, k.T, k.H * D}, at::kDouble);
    // The reference: scores of head h against K/V head h / (H / Hkv), masked to [start, own position].
    at::Tensor q64 = q.clone().requires_grad_(), k64 = kk.clone().requires_grad_(), v64 = v.clone().requires_grad_();
    const int64_t rep = k.H / k.Hkv;
    at::Tensor ke = k64.repeat_interleave(rep, 2).permute({0, 2, 1, 3}), ve = v64.repeat_interleave(rep, 2).permute({0, 2, 1, 3});
    at::Tensor scores = at::matmul(q64.permute({0, 2, 1, 3}), ke.transpose(2, 3)) / std::sqrt(static_cast<double>(D));
    at::Tensor key_pos = at::arange(k.S, at::kLong).view({1, 1, 1, k.S});
    at::Tensor own = (at::arange(k.T, at::kLong) + (k.S - k.T)).view({1, 1, k.T, 1});
    at::Tensor first = at::tensor(k.starts, at::kLong).view({B, 1, 1, 1});
    at::Tensor seen = key_pos.ge(first).logical_and(key_pos.le(own));  // [B, 1, T, S]
    at::Tensor p = at::softmax(scores.masked_fill(seen.logical_not(), -INFINITY), -1);
    p = at::where(seen.any(-1, true), p, at::zeros_like(p));  // no key: 0, not softmax's NaN
    at::Tensor ref = at::matmul(p, ve).permute({0, 2, 1, 3}).reshape({B, k.T, k.H * D});
    auto g_ref = torch::autograd::grad({(ref * w).sum()}, {q64, k64, v64});
    // attend() in fp32; also with K/V heads repeated (the form fp32 takes on CUDA).
    for (bool repeated : {false, true}) {
      SCOPED_TRACE(repeated ? "K/V heads repeated" : "enable_gqa");
      std::optional<detail::RepeatKvHeadsScope> scope;
      if (repeated) scope.emplace();
      at::Tensor q32 = q.to(at::kFloat).requires_grad_(), k32 = kk.to(at::kFloat).requires_grad_(),
                 v32 = v.to(at::kFloat).requires_grad_();
      detail::AttnInputs a;
      a.key_start = k.starts;
      at::Tensor out = detail::attend(c, q32, k32, v32, a);
      ASSERT_EQ(out.sizes(), ref.sizes());
      EXPECT_LT(max_abs(out.to(at::kDouble), ref), 1e-5);
      EXPECT_EQ(out.masked_select(seen.squeeze(1).any(-1, true).logical_not().expand({B, k.T, k.H * D})).ne(0).sum().item<int64_t>(), 0);
      auto g = torch::autograd::grad({(out * w.to(at::kFloat)).sum()}, {q32, k32, v32}, {}, false, false, true);
      for (size_t i = 0; i < 3; ++i) {
        ASSERT_TRUE(g[i].defined()) << i;
        EXPECT_LT(max_abs(g[i].to(at::kDouble), g_ref[i]), 1e-5) << "gradient " << i;
      }
    }
  }
  for (int64_t S : {16, 2048})
    EXPECT_TRUE(detail::key_start_form_pays(S, S, 0)) << "T = S: the mask-free form is always the smaller";
  EXPECT_FALSE(detail::key_start_form_pays(256, 320, 0));   // short responses: the mask
  EXPECT_TRUE(detail::key_start_form_pays(1024, 1280, 0));  // long ones: mask-free
  EXPECT_FALSE(detail::key_start_form_pays(1024, 1024 + 300, 0));
  EXPECT_TRUE(detail::key_start_form_pays(1024, 1024 + 300, 44));
}

// Every unmasked grouped-query form of attend() (causal, full, packed, key_start with one
// start, a start per row, and fewer queries than keys) gives the same values and gradients
// with K/V heads repeated to the query heads as with SDPA's enable_gqa; the repeated calls are
// reported under their own keys (on the CPU: the flash kernel).
TEST(RepeatedKvHeads, EqualTheGroupedCallInEveryUnmaskedForm) {
  ModelConfig c = ModelConfig::from_json(test::tiny_config_json("qwen2", ""), "test config");
  const int64_t H = 6, Hkv = 2, D = 8;
  c.num_attention_heads = H, c.num_key_value_heads = Hkv, c.head_dim = D;
  struct Form {
    const char* kind;
    int64_t B, T, S;
    detail::AttnInputs a;
  };
  std::vector<Form> forms(6);
  forms[0] = {"causal", 2, 9, 9, {}};
  forms[0].a.is_causal = true;
  forms[1] = {"full", 2, 9, 9, {}};
  forms[2] = {"packed", 1, 9, 9, {}};
  forms[2].a.seq_lens = {3, 5, 1};
  forms[3] = {"causal_from_key_start", 3, 9, 9, {}};
  forms[3].a.key_start = {2, 2, 2};
  forms[4] = {"causal_from_key_start", 3, 9, 9, {}};
  forms[4].a.key_start = {0, 4, 7};
  forms[5] = {"causal_from_key_start_offset", 3, 5, 12, {}};
  forms[5].a.key_start = {0, 3, 6};
  for (const Form& f : forms) {
    SCOPED_TRACE(f.kind);
    at::manual_seed(f.B * 100 + f.T + f.S);
    const at::Tensor q = at::randn({f.B, f.T, H, D}), k = at::randn({f.B, f.S, Hkv, D}), v = at::randn({f.B, f.S, Hkv, D}),
                     w = at::randn({f.B, f.T, H * D});
    std::vector<at::Tensor> results[2];
    for (int repeated = 0; repeated < 2; ++repeated) {
      std::optional<detail::RepeatKvHeadsScope> scope;
      if (repeated) scope.emplace();
      at::Tensor qg = q.clone().requires_grad_(), kg = k.clone().requires_grad_(), vg = v.clone().requires_grad_();
      at::Tensor out = detail::attend(c, qg, kg, vg, f.a);
      results[repeated] = torch::autograd::grad({(out * w).sum()}, {qg, kg, vg});
      results[repeated].insert(results[repeated].begin(), out.detach());
    }
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_GT(results[0][i].abs().max().item<double>(), 0.0) << i;
      EXPECT_LT(max_abs(results[1][i], results[0][i]), 1e-6) << (i == 0 ? "output" : "gradient ") << i;
    }
    const auto seen = sdpa_backends();
    const std::string key = std::string("cpu/Float/") + f.kind + "_repeated_kv";
    ASSERT_TRUE(seen.count(key)) << key;
    EXPECT_EQ(seen.at(key), "flash_attention") << key;
  }
}

// The starts of the trainer's rows (left and right padding); anything else has none.
TEST(KeyStartAttention, StartsOnlyForRowsOfContiguousTokens) {
  auto starts = [](std::vector<int64_t> rows, int64_t T) {
    return detail::contiguous_key_starts(at::tensor(rows, at::kLong).view({-1, T}));
  };
  EXPECT_EQ(starts({0, 0, 1, 1, 0, 1, 1, 1, 1, 1, 1, 0}, 4), (std::vector<int64_t>{2, 1, 0}));
  EXPECT_FALSE(starts({1, 0, 1, 1}, 4).has_value());  // a hole
  EXPECT_FALSE(starts({1, 1, 1, 1, 0, 0, 0, 0}, 4).has_value());  // a row without a token
}

// The padded path with responses long enough for the mask-free suffix
// (detail::key_start_form_pays: R >= 1024) against the packed path (one causal SDPA per
// sequence, nothing shared with the key_start code): left-padded prompts of three lengths,
// responses of several lengths, two rows sharing a prompt; log-probs, entropies and gradients;
// with and without gradient checkpointing.
TEST(PackedLogProbs, LongResponsesTakeTheMaskFreeSuffixAndEqualThePackedPath) {
  CausalLM m = test::random_model("qwen2", at::kFloat, R"("max_position_embeddings": 4096)");
  const int64_t P = 9, R = 1030, T = P + R;
  const std::vector<std::pair<int64_t, int64_t>> rows = {{9, 1030}, {9, 700}, {4, 1029}, {1, 1}};  // (prompt, response)
  const int64_t B = static_cast<int64_t>(rows.size());
  ASSERT_TRUE(detail::key_start_form_pays(R, P - 1 + R, 0));
  Batch b;
  at::manual_seed(13);
  b.input_ids = at::randint(1, m.config().vocab_size, {B, T}, at::kLong);
  b.input_ids[1].narrow(0, 0, P).copy_(b.input_ids[0].narrow(0, 0, P));
  b.attention_mask = at::zeros({B, T}, at::kLong);
  b.response_mask = at::zeros({B, R}, at::kLong);
  for (int64_t i = 0; i < B; ++i) {
    auto [p, r] = rows[static_cast<size_t>(i)];
    b.attention_mask[i].narrow(0, P - p, p + r).fill_(1);
    b.response_mask[i].narrow(0, 0, r).fill_(1);
  }
  b.input_ids.mul_(b.attention_mask);
  b.targets = b.input_ids.narrow(1, P, R);
  const at::Tensor mask = b.response_mask.to(at::kBool);
  for (bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "gradient checkpointing" : "no checkpointing");
    m.set_gradient_checkpointing(checkpointing);
    Result padded = run(m, b, false), packed = run(m, b, true);
    EXPECT_TRUE(sdpa_backends().count("cpu/Float/causal_from_key_start_offset")) << "the suffix took the mask";
    EXPECT_LT(test::max_abs_diff_masked(padded.log_probs, packed.log_probs, mask), 1e-5);
    EXPECT_LT(test::max_abs_diff_masked(padded.entropy, packed.entropy, mask), 1e-5);
    EXPECT_LT(std::abs(padded.loss.item<double>() - packed.loss.item<double>()), 1e-6);
    auto names = m.named_parameters();
    for (size_t i = 0; i < padded.grads.size(); ++i) {
      EXPECT_GT(padded.grads[i].abs().max().item<double>(), 0.0) << names[i].first;
      EXPECT_LT(max_abs(padded.grads[i], packed.grads[i]), 1e-5) << names[i].first;
    }
  }
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
