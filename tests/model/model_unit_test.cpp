// Properties of the model that need no oracle: chunked log-probs equal the naive
// full-logits computation (values and gradients), gradient checkpointing changes no
// gradient, the KV cache handles slot reuse, and config parsing accepts both config.json
// spellings and rejects unsupported values.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "model_test_util.h"
#include "rpg/core/error.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/cuda_graph.h"
#include "test_devices.h"
#include "test_util.h"

namespace rpg::model {
namespace {

using test::padded_batch;
using test::random_model;

// The straightforward computation the chunked path must equal: full [B, T, V] logits in
// fp32, log_softmax, gather.
TokenLogProbs naive_log_probs(const CausalLM& m, const test::PaddedBatch& b, const at::Tensor& targets, double tau) {
  const int64_t T = b.input_ids.size(1), R = targets.size(1);
  at::Tensor z = m.forward(b.input_ids, b.attention_mask, b.position_ids).narrow(1, T - R - 1, R).to(at::kFloat) / tau;
  at::Tensor logp = at::log_softmax(z, -1);
  return {logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1), -(logp.exp() * logp).sum(-1)};
}

std::vector<at::Tensor> grads_of(const CausalLM& m, const at::Tensor& loss) {
  auto params = m.parameters();
  return torch::autograd::grad({loss}, params, {}, /*retain_graph=*/false, /*create_graph=*/false,
                               /*allow_unused=*/true);
}

void expect_close(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b, double atol,
                  const CausalLM& m) {
  ASSERT_EQ(a.size(), b.size());
  auto names = m.named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_TRUE(a[i].defined() && b[i].defined()) << names[i].first;
    double d = (a[i] - b[i]).abs().max().item<double>();
    EXPECT_LE(d, atol) << names[i].first << " (grad scale " << b[i].abs().max().item<double>() << ")";
  }
}

// Each family on each test device (CPU always, CUDA when present: test_devices.h).
class PerFamily : public ::testing::TestWithParam<std::tuple<std::string, at::Device>> {
 protected:
  const std::string& family() const { return std::get<0>(GetParam()); }
  at::Device device() const { return std::get<1>(GetParam()); }
  double tol(double cpu_tol) const { return rpg::test::fp32_tol(device(), cpu_tol); }
};
INSTANTIATE_TEST_SUITE_P(Families, PerFamily,
                         ::testing::Combine(::testing::Values("qwen2", "qwen3", "llama"),
                                            ::testing::ValuesIn(rpg::test::rpg_test_devices())),
                         rpg::test::NameDeviceParamName());

TEST_P(PerFamily, ChunkedLogProbsAndEntropiesEqualNaiveValuesAndGradients) {
  for (bool tied : {false, true}) {
    SCOPED_TRACE(tied ? "tied" : "untied");
    CausalLM m = random_model(family(), at::kFloat, tied ? R"("tie_word_embeddings": true)" : "", 3, device());
    auto b = padded_batch(m.config().vocab_size, 7);
    at::Tensor targets = b.input_ids.narrow(1, b.P, b.R);
    at::Tensor resp = b.attention_mask.narrow(1, b.P, b.R).to(at::kFloat);
    at::manual_seed(11);
    at::Tensor w_lp = (at::randn({4, b.R}) * resp).to(device()), w_ent = (at::randn({4, b.R}) * resp).to(device());
    for (double tau : {1.0, 0.6}) {
      TokenLogProbs naive = naive_log_probs(m, b, targets, tau);
      auto g_naive = grads_of(m, (naive.log_probs * w_lp).sum() + (naive.entropy * w_ent).sum());
      for (int64_t chunk : {1, 3, 64}) {
        SCOPED_TRACE(testing::Message() << "tau " << tau << " chunk " << chunk);
        TokenLogProbs c = m.log_probs(b.input_ids, b.attention_mask, b.position_ids, targets, {tau, true, chunk});
        EXPECT_TRUE(c.log_probs.device() == device());
        // On response tokens: at padding the two forms' values are finite and meaningless
        // (LogProbOptions), and differ (the full forward attends from each row's first token).
        const at::Tensor on = resp.to(device());
        EXPECT_LE(((c.log_probs - naive.log_probs) * on).abs().max().item<double>(), tol(1e-5));
        EXPECT_LE(((c.entropy - naive.entropy) * on).abs().max().item<double>(), tol(1e-5));
        EXPECT_TRUE(at::isfinite(c.log_probs).all().item<bool>() && at::isfinite(naive.log_probs).all().item<bool>());
        auto g = grads_of(m, (c.log_probs * w_lp).sum() + (c.entropy * w_ent).sum());
        expect_close(g, g_naive, tol(1e-5), m);
      }
    }
    // Without entropy: only log-probs, still differentiable.
    TokenLogProbs c = m.log_probs(b.input_ids, b.attention_mask, b.position_ids, targets, {1.0, false, 4});
    EXPECT_FALSE(c.entropy.defined());
    EXPECT_TRUE(c.log_probs.requires_grad());
    // Entropy computed but left out of the loss (the trainer's metric at entropy_coeff 0): the
    // gradient is the log-probs' alone, bit for bit (its term is skipped, not multiplied by 0).
    TokenLogProbs e = m.log_probs(b.input_ids, b.attention_mask, b.position_ids, targets, {1.0, true, 4});
    auto g_lp_only = grads_of(m, (c.log_probs * w_lp).sum());
    auto g_unused_ent = grads_of(m, (e.log_probs * w_lp).sum());
    for (size_t i = 0; i < g_lp_only.size(); ++i) EXPECT_TRUE(at::equal(g_lp_only[i], g_unused_ent[i])) << i;
  }
}

// LogProbOptions::keep_logits_bytes: a forward that keeps its log-probabilities for the
// backward gives the values and gradients of one that recomputes them there, bit for bit, in
// both backward forms, with and without the entropy's term, at two temperatures, padded and
// packed, fp32 and bf16; a no-grad pass and a budget one byte short keep nothing; a second
// backward over the same graph (retain_graph) recomputes and agrees too.
TEST_P(PerFamily, KeptLogProbsGiveTheRecomputedGradientsBitForBit) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    CausalLM m = random_model(family(), dtype, R"("tie_word_embeddings": true)", 3, device());
    auto b = padded_batch(m.config().vocab_size, 7);
    at::Tensor targets = b.input_ids.narrow(1, b.P, b.R);
    at::manual_seed(5);
    at::Tensor w_lp = at::randn({4, b.R}).to(device()), w_ent = at::randn({4, b.R}).to(device());
    const int64_t all_rows_bytes = 4 * b.R * m.config().vocab_size * 4;  // padded path: every [B, R] row
    for (bool autograd_backward : {false, true})
      for (bool packed : {false, true})
        for (double tau : {1.0, 0.6})
          for (bool entropy_in_loss : {false, true}) {
            SCOPED_TRACE(testing::Message() << at::toString(dtype) << " autograd_backward " << autograd_backward
                                            << " packed " << packed << " tau " << tau << " entropy "
                                            << entropy_in_loss);
            auto run = [&](int64_t budget, bool twice) {
              LogProbOptions o{tau, true, 3};
              o.autograd_backward = autograd_backward;
              o.remove_padding = packed;
              o.keep_logits_bytes = budget;
              TokenLogProbs c = m.log_probs(b.input_ids, b.attention_mask, b.position_ids, targets, o);
              at::Tensor loss = (c.log_probs * w_lp).sum();
              if (entropy_in_loss) loss = loss + (c.entropy * w_ent).sum();
              auto params = m.parameters();
              auto g = torch::autograd::grad({loss}, params, {}, /*retain_graph=*/twice, false, true);
              if (twice) {
                auto again = torch::autograd::grad({loss}, params, {}, false, false, true);
                for (size_t i = 0; i < g.size(); ++i) EXPECT_TRUE(at::equal(g[i], again[i])) << "second backward " << i;
              }
              return std::make_pair(c, g);
            };
            auto [recomputed, g_recomputed] = run(0, false);
            EXPECT_EQ(recomputed.kept_logits_bytes, 0);
            auto [kept, g_kept] = run(int64_t{1} << 40, true);
            EXPECT_GT(kept.kept_logits_bytes, 0);
            EXPECT_LE(kept.kept_logits_bytes, all_rows_bytes);
            EXPECT_TRUE(at::equal(kept.log_probs, recomputed.log_probs));
            EXPECT_TRUE(at::equal(kept.entropy, recomputed.entropy));
            for (size_t i = 0; i < g_kept.size(); ++i) EXPECT_TRUE(at::equal(g_kept[i], g_recomputed[i])) << i;
            auto [short_budget, g_short] = run(kept.kept_logits_bytes - 1, false);
            EXPECT_EQ(short_budget.kept_logits_bytes, 0);
          }
    c10::NoGradGuard no_grad;
    TokenLogProbs c = m.log_probs(b.input_ids, b.attention_mask, b.position_ids, targets);
    EXPECT_EQ(c.kept_logits_bytes, 0);
  }
}

// LogProbOptions::split_prompt (each distinct prompt prefix once, the last layer's K/V only
// there) against the full forward over every column (split_prompt = false): log-probs,
// entropies and gradients, on groups of rows sharing a left-padded prompt, responses of
// 1..R tokens, a lone row, and prompts of one token (no prefix at all); with and without
// gradient checkpointing (each split layer checkpointed).
TEST_P(PerFamily, SplitPromptEqualsTheFullForwardValuesAndGradients) {
  for (bool checkpointing : {false, true}) {
    SCOPED_TRACE(checkpointing ? "gradient checkpointing" : "no checkpointing");
    CausalLM m = random_model(family(), at::kFloat, "", 17, device());
    const int64_t V = m.config().vocab_size;
    // prompt lengths per group (left-padded to P) and response lengths per row (right-padded to R)
    const std::vector<std::vector<int64_t>> cases_p = {{5, 3, 5, 1}, {1, 1}};
    const std::vector<int64_t> Ps = {6, 1};
    for (size_t ci = 0; ci < cases_p.size(); ++ci) {
      const int64_t P = Ps[ci], R = 5, n = 3;
      const auto& groups = cases_p[ci];
      const int64_t B = static_cast<int64_t>(groups.size()) * n - 1;  // the last group has n-1 rows
      SCOPED_TRACE(testing::Message() << "P " << P << " B " << B);
      at::manual_seed(static_cast<uint64_t>(23 + ci));
      at::Tensor ids = at::randint(1, V, {B, P + R}, at::kLong), mask = at::ones({B, P + R}, at::kLong);
      for (int64_t b = 0; b < B; ++b) {
        const int64_t g = b / n, lp = groups[static_cast<size_t>(g)], lr = 1 + (b * 2) % R;  // 1..R response tokens
        ids[b].narrow(0, 0, P).copy_(ids[g * n].narrow(0, 0, P));
        mask[b].narrow(0, 0, P - lp).zero_();
        mask[b].narrow(0, P + lr, R - lr).zero_();
      }
      ids.mul_(mask);
      at::Tensor pos = (mask.cumsum(1) - 1).clamp_min(0);
      ids = ids.to(device()), mask = mask.to(device()), pos = pos.to(device());
      at::Tensor targets = ids.narrow(1, P, R);
      at::Tensor resp = mask.narrow(1, P, R).to(at::kFloat);
      at::manual_seed(5);
      at::Tensor w_lp = at::randn({B, R}).to(device()) * resp, w_ent = at::randn({B, R}).to(device()) * resp;
      auto run = [&](bool split, double tau) {
        LogProbOptions o{tau, true, 4};
        o.split_prompt = split;
        // The full forward without checkpointing is the reference of both.
        m.set_gradient_checkpointing(split && checkpointing);
        TokenLogProbs lp = m.log_probs(ids, mask, pos, targets, o);
        auto g = grads_of(m, (lp.log_probs * w_lp).sum() + (lp.entropy * w_ent).sum());
        return std::make_tuple(lp.log_probs.detach() * resp, lp.entropy.detach() * resp, g);
      };
      for (double tau : {1.0, 0.7}) {
        auto [lp0, ent0, g0] = run(false, tau);
        auto [lp1, ent1, g1] = run(true, tau);
        EXPECT_LE((lp1 - lp0).abs().max().item<double>(), tol(1e-5));
        EXPECT_LE((ent1 - ent0).abs().max().item<double>(), tol(1e-5));
        expect_close(g1, g0, tol(1e-5), m);
        EXPECT_GT(lp0.abs().max().item<double>(), 0.1);  // the comparison sees real values
      }
      // No grad (the reference pass) takes the same path.
      at::NoGradGuard no_grad;
      LogProbOptions o{1.0, false, 64};
      at::Tensor a = m.log_probs(ids, mask, pos, targets, o).log_probs * resp;
      o.split_prompt = false;
      at::Tensor b = m.log_probs(ids, mask, pos, targets, o).log_probs * resp;
      EXPECT_LE((a - b).abs().max().item<double>(), tol(1e-5));
    }
  }
}

TEST_P(PerFamily, GradientCheckpointingGivesTheSameGradients) {
  CausalLM m = random_model(family(), at::kFloat, "", 5, device());
  auto b = padded_batch(m.config().vocab_size, 9);
  at::Tensor targets = b.input_ids.narrow(1, b.P, b.R);
  auto run = [&] {
    LogProbOptions o{0.8, true, 7};
    o.split_prompt = false;  // the full forward per checkpointed layer (the split one: SplitPrompt... above)
    TokenLogProbs lp = m.log_probs(b.input_ids, b.attention_mask, b.position_ids, targets, o);
    at::Tensor resp = b.attention_mask.narrow(1, b.P, b.R).to(device(), at::kFloat);
    return grads_of(m, ((lp.log_probs - 0.01 * lp.entropy) * resp).sum());
  };
  auto plain = run();
  m.set_gradient_checkpointing(true);
  ASSERT_TRUE(m.gradient_checkpointing());
  auto ckpt = run();
  expect_close(ckpt, plain, tol(1e-6), m);
  // Also through the plain logits path with no mask (causal SDPA flag) and .backward().
  for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
  m.forward(b.input_ids).pow(2).mean().backward();
  auto with = m.parameters();
  std::vector<at::Tensor> g1;
  for (auto& p : with) g1.push_back(p.grad().clone());
  m.set_gradient_checkpointing(false);
  for (auto& p : m.parameters()) p.mutable_grad() = at::Tensor();
  m.forward(b.input_ids).pow(2).mean().backward();
  std::vector<at::Tensor> g0;
  for (auto& p : m.parameters()) g0.push_back(p.grad().clone());
  expect_close(g1, g0, tol(1e-6), m);
}

TEST_P(PerFamily, KVCacheSlotsAreIndependentAndReusable) {
  CausalLM m = random_model(family(), at::kFloat, "", 13, device());
  const double eps = tol(1e-5);
  at::NoGradGuard no_grad;
  at::manual_seed(3);
  at::Tensor a = at::randint(1, m.config().vocab_size, {1, 9}, at::kLong);
  at::Tensor c = at::randint(1, m.config().vocab_size, {1, 4}, at::kLong);
  at::Tensor full_a = m.forward(a), full_c = m.forward(c);
  KVCache cache = m.new_cache(2, 12);
  // Fill slot 1 with a, then reuse it for c after a reset: the longer stale entries of a
  // must be invisible to c.
  at::Tensor pa = m.decode(cache, {1}, a.narrow(1, 0, 5));
  at::Tensor pa2 = m.decode(cache, {1}, a.narrow(1, 5, 4));
  EXPECT_LE((at::cat({pa, pa2}, 1) - full_a).abs().max().item<double>(), eps);
  EXPECT_EQ(cache.length(1), 9);
  cache.reset(1);
  at::Tensor pc = m.decode(cache, {1}, c.narrow(1, 0, 1));
  for (int64_t t = 1; t < 4; ++t) pc = at::cat({pc, m.decode(cache, {1}, c.narrow(1, t, 1))}, 1);
  EXPECT_LE((pc - full_c).abs().max().item<double>(), eps);
  // Both slots in one call, in slot order (the no-gather path) and reversed.
  cache.reset();
  at::Tensor both = m.decode(cache, {0, 1}, at::cat({a.narrow(1, 0, 4), c}, 0));
  EXPECT_LE((both[0] - full_a[0].narrow(0, 0, 4)).abs().max().item<double>(), eps);
  EXPECT_LE((both[1] - full_c[0]).abs().max().item<double>(), eps);
  at::Tensor next = m.decode(cache, {1, 0}, at::cat({at::full({1, 1}, 7, at::kLong), a.narrow(1, 4, 1)}, 0));
  EXPECT_LE((next[1][0] - full_a[0][4]).abs().max().item<double>(), eps);
  at::Tensor c_ext = at::cat({c, at::full({1, 1}, 7, at::kLong)}, 1);
  EXPECT_LE((next[0][0] - m.forward(c_ext)[0][4]).abs().max().item<double>(), eps);
  // Ragged prefill of right-padded rows, last-token logits only, then one step.
  cache.reset();
  at::Tensor padded = at::cat({a.narrow(1, 0, 6), at::cat({c, at::zeros({1, 2}, at::kLong)}, 1)}, 0);  // [2, 6]
  at::Tensor last = m.decode(cache, {0, 1}, padded, {{6, 4}, true});
  ASSERT_EQ(last.sizes(), (at::IntArrayRef{2, m.config().vocab_size}));
  EXPECT_EQ(cache.length(0), 6);
  EXPECT_EQ(cache.length(1), 4);
  EXPECT_LE((last[0] - full_a[0][5]).abs().max().item<double>(), eps);
  EXPECT_LE((last[1] - full_c[0][3]).abs().max().item<double>(), eps);
  at::Tensor step = m.decode(cache, {0, 1}, at::cat({a.narrow(1, 6, 1), at::full({1, 1}, 7, at::kLong)}, 0));
  EXPECT_LE((step[0][0] - full_a[0][6]).abs().max().item<double>(), eps);
  EXPECT_LE((step[1][0] - m.forward(c_ext)[0][4]).abs().max().item<double>(), eps);
  EXPECT_THROW(m.decode(cache, {0, 1}, padded, {{6}, false}), ValueError);
  EXPECT_THROW(m.decode(cache, {0, 1}, padded, {{7, 1}, false}), ValueError);
  // copy_slot: one prefill shared by two continuations.
  cache.reset();
  m.decode(cache, {0}, a.narrow(1, 0, 5));
  cache.copy_slot(0, 1);
  EXPECT_EQ(cache.length(1), 5);
  at::Tensor fork = m.decode(cache, {0, 1}, at::cat({a.narrow(1, 5, 1), at::full({1, 1}, 7, at::kLong)}, 0));
  at::Tensor a_alt = at::cat({a.narrow(1, 0, 5), at::full({1, 1}, 7, at::kLong)}, 1);
  EXPECT_LE((fork[0][0] - full_a[0][5]).abs().max().item<double>(), eps);
  EXPECT_LE((fork[1][0] - m.forward(a_alt)[0][5]).abs().max().item<double>(), eps);
  EXPECT_THROW(cache.copy_slot(0, 9), ValueError);
  // Misuse is an error, not a crash.
  EXPECT_THROW(m.decode(cache, {0}, at::zeros({1, 20}, at::kLong)), ValueError);
  EXPECT_THROW(m.decode(cache, {5}, at::zeros({1, 1}, at::kLong)), ValueError);
  EXPECT_THROW(m.decode(cache, {0, 0}, at::zeros({2, 1}, at::kLong)), ValueError);
}

TEST_P(PerFamily, CopiedPromptsDecodeTogetherAsTheFullForward) {
  // decode() reads a prompt copied into several slots from one of them (KVCache's prefix
  // bookkeeping): through a reset and refill of the slot it was read from, a copy of a slot
  // that has grown past its prompt, and a slot shortened below its prompt.
  CausalLM m = random_model(family(), at::kFloat, "", 17, device());
  const double eps = tol(1e-5);
  at::NoGradGuard no_grad;
  at::manual_seed(4);
  const int64_t V = m.config().vocab_size;
  at::Tensor a = at::randint(1, V, {1, 6}, at::kLong), c = at::randint(1, V, {1, 5}, at::kLong);
  std::vector<at::Tensor> seq(4);  // each slot's tokens so far
  KVCache cache = m.new_cache(4, 16);
  m.decode(cache, {2}, a);
  for (int64_t s : {0, 1, 3}) cache.copy_slot(2, s);
  for (auto& t : seq) t = a;
  // One step of the given slots, each with its own next token, checked against the forward.
  auto step = [&](const std::vector<int64_t>& slots) {
    at::Tensor next = at::randint(1, V, {static_cast<int64_t>(slots.size()), 1}, at::kLong);
    at::Tensor logits = m.decode(cache, slots, next);
    for (size_t i = 0; i < slots.size(); ++i) {
      auto& t = seq[static_cast<size_t>(slots[i])];
      t = at::cat({t, next.narrow(0, static_cast<int64_t>(i), 1)}, 1);
      EXPECT_LE((logits[static_cast<int64_t>(i)][0] - m.forward(t)[0][t.size(1) - 1]).abs().max().item<double>(), eps)
          << "slot " << slots[i] << " at " << t.size(1);
    }
  };
  step({3, 0, 2, 1});
  cache.reset(2);  // the slot the others read their prompt from takes another prompt
  m.decode(cache, {2}, c);
  seq[2] = c;
  step({2, 0, 3, 1});
  cache.copy_slot(1, 2);  // grown past the prompt it shares
  seq[2] = seq[1];
  step({2, 1, 0});
  step({3, 2});
  cache.set_length(0, 4);  // below its prompt: the others may read only its first 4 positions
  seq[0] = seq[0].narrow(1, 0, 4);
  step({0, 3, 1, 2});
  step({1, 0, 3});
}

class OnDevice : public ::testing::TestWithParam<at::Device> {};
INSTANTIATE_TEST_SUITE_P(Devices, OnDevice, ::testing::ValuesIn(rpg::test::rpg_test_devices()), rpg::test::DeviceParamName());

// Which SDPA kernel ran is reported (never the math fallback silently): unmasked causal
// attention, a padded batch's mask-free form and a prefill into empty cache slots get the
// CPU's flash kernel on the CPU and a fused kernel on CUDA.
TEST_P(OnDevice, SdpaBackendIsReported) {
  CausalLM m = random_model("qwen2", GetParam().is_cuda() ? at::kBFloat16 : at::kFloat, "", 3, GetParam());
  at::NoGradGuard no_grad;
  m.forward(at::randint(1, 300, {2, 7}, at::kLong));
  // A padded batch (left and right padding) takes the mask-free form (AttnInputs::key_start).
  m.forward(at::randint(1, 300, {2, 7}, at::kLong), at::tensor({0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}).view({2, 7}));
  // Prompts into empty cache slots (right-padded to one length): causal over their own keys.
  auto prefill = [](const CausalLM& model) {
    KVCache cache = model.new_cache(2, 9);
    model.decode(cache, {1, 0}, at::randint(1, 300, {2, 5}, at::kLong), {{5, 3}, true});
  };
  prefill(m);
  const std::string prefix = GetParam().is_cuda() ? "cuda/BFloat16" : "cpu/Float";
  auto seen = sdpa_backends();
  for (const std::string& key : {prefix + "/causal", prefix + "/causal_from_key_start", prefix + "/prefill"}) {
    ASSERT_TRUE(seen.count(key)) << key;
    if (GetParam().is_cuda()) {
      EXPECT_NE(seen[key], "math") << key;
      EXPECT_NE(seen[key], "error") << key;
    } else {
      EXPECT_EQ(seen[key], "flash_attention") << key;
    }
  }
  if (!GetParam().is_cuda()) return;
  // fp32 on CUDA: no fused kernel shares K/V heads there, so the grouped calls repeat them
  // (grouped_sdpa) rather than fall back to the math kernel.
  CausalLM m32 = random_model("qwen2", at::kFloat, "", 3, GetParam());
  ASSERT_NE(m32.config().num_attention_heads, m32.config().num_key_value_heads);
  m32.forward(at::randint(1, 300, {2, 7}, at::kLong));
  m32.forward(at::randint(1, 300, {2, 7}, at::kLong), at::tensor({0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0}).view({2, 7}));
  prefill(m32);
  seen = sdpa_backends();
  for (const std::string kind : {"causal", "causal_from_key_start", "prefill"}) {
    int calls = 0;
    for (const std::string& key : {"cuda/Float/" + kind, "cuda/Float/" + kind + "_repeated_kv"}) {
      if (!seen.count(key)) continue;
      ++calls;
      EXPECT_NE(seen[key], "math") << key;
      EXPECT_NE(seen[key], "error") << key;
    }
    EXPECT_GE(calls, 1) << kind;
  }
}

// decode_all_slots (fixed shapes, no host read) equals decode() over two steps after a
// ragged prefill, attending the whole capacity or only the positions up to the furthest
// write (kv_len); on CUDA the same step captured in a CUDA graph replays to the same logits
// with new token/position contents, and so does a second graph of another kv_len sharing the
// first one's memory pool, the two replayed in turn (the plugin must be loaded there: a
// missing one fails).
TEST_P(OnDevice, StaticDecodeEqualsDecodeAndReplaysInACudaGraph) {
  const at::Device dev = GetParam();
  const double eps = rpg::test::fp32_tol(dev, 1e-5);
  CausalLM m = random_model("qwen2", at::kFloat, "", 17, dev);
  at::NoGradGuard no_grad;
  const int64_t S = 3, cap = 12;
  const std::vector<int64_t> lens{4, 2, 3};
  at::manual_seed(5);
  at::Tensor prompts = at::randint(1, 300, {S, 4}, at::kLong);
  at::Tensor tok1 = at::randint(1, 300, {S, 1}, at::kLong), tok2 = at::randint(1, 300, {S, 1}, at::kLong);
  auto prefilled = [&] {
    KVCache c = m.new_cache(S, cap);
    m.decode(c, {0, 1, 2}, prompts, {lens, true});
    return c;
  };
  KVCache ref_cache = prefilled();
  at::Tensor ref1 = m.decode(ref_cache, {0, 1, 2}, tok1), ref2 = m.decode(ref_cache, {0, 1, 2}, tok2);  // [S, 1, V]
  at::Tensor pos1 = at::tensor(lens, at::kLong).to(dev), pos2 = pos1 + 1;
  KVCache c = prefilled();
  EXPECT_LE((m.decode_all_slots(c, tok1.to(dev), pos1) - ref1).abs().max().item<double>(), eps);
  EXPECT_LE((m.decode_all_slots(c, tok2.to(dev), pos2) - ref2).abs().max().item<double>(), eps);
  KVCache short_span = prefilled();  // positions 4 and 5 are the furthest writes
  EXPECT_LE((m.decode_all_slots(short_span, tok1.to(dev), pos1, 5) - ref1).abs().max().item<double>(), eps);
  EXPECT_LE((m.decode_all_slots(short_span, tok2.to(dev), pos2, 6) - ref2).abs().max().item<double>(), eps);
  EXPECT_THROW(m.decode_all_slots(c, tok1.narrow(0, 0, 2).to(dev), pos1), ValueError);
  EXPECT_THROW(m.decode_all_slots(c, tok1.to(dev), pos1.to(at::kInt)), ValueError);
  EXPECT_THROW(m.decode_all_slots(c, tok1.to(dev), pos1, cap + 1), ValueError);
  EXPECT_THROW(m.decode_all_slots(c, tok1.to(dev), pos1, -1), ValueError);
  c.set_length(0, 6);
  EXPECT_EQ(c.length(0), 6);
  EXPECT_THROW(c.set_length(0, cap + 1), ValueError);
  if (!dev.is_cuda()) {
    EXPECT_FALSE(cuda_graphs_available());  // the plugin is loaded with the CUDA backend only
    return;
  }
  ASSERT_TRUE(cuda_graphs_available()) << "librpg_cuda.so was not loaded with the CUDA backend";
  KVCache g = prefilled();
  at::Tensor tok = tok1.to(dev).clone(), pos = pos1.clone(), out;
  auto graph = capture_cuda_graph([&] { out = m.decode_all_slots(g, tok, pos); });
  graph->replay();
  EXPECT_LE((out - ref1).abs().max().item<double>(), eps);
  tok.copy_(tok2.to(dev));
  pos.add_(1);
  graph->replay();
  EXPECT_LE((out - ref2).abs().max().item<double>(), eps);
  // Spans of 5 and 6 positions, the second graph in the first one's pool; their outputs are
  // copied out of the pool (as the engine's steps do) and compared after both replayed.
  KVCache h = prefilled();
  tok.copy_(tok1.to(dev));
  pos.copy_(pos1);
  at::Tensor out5 = at::zeros_like(ref1), out6 = at::zeros_like(ref2);
  auto five = capture_cuda_graph([&] { out5.copy_(m.decode_all_slots(h, tok, pos, 5)); });
  auto six = capture_cuda_graph([&] { out6.copy_(m.decode_all_slots(h, tok, pos, 6)); }, five.get());
  five->replay();
  tok.copy_(tok2.to(dev));
  pos.add_(1);
  six->replay();
  EXPECT_LE((out5 - ref1).abs().max().item<double>(), eps);
  EXPECT_LE((out6 - ref2).abs().max().item<double>(), eps);
}

TEST_P(OnDevice, Bf16ModelRunsAndTracksFp32) {
  CausalLM m32 = random_model("qwen3", at::kFloat, "", 21, GetParam());
  CausalLM m16(m32.config(), at::kBFloat16, GetParam());
  m16.copy_parameters_from(m32);
  auto b = padded_batch(m32.config().vocab_size, 2);
  at::NoGradGuard no_grad;
  at::Tensor l32 = m32.forward(b.input_ids, b.attention_mask), l16 = m16.forward(b.input_ids, b.attention_mask);
  EXPECT_EQ(l16.scalar_type(), at::kBFloat16);
  EXPECT_LE(test::max_abs_diff_masked(l16, l32, b.attention_mask), 5e-2);
}

TEST(ModelUnit, NamedParametersAreTrainableLeavesWithHfNames) {
  CausalLM m = random_model("qwen2", at::kFloat, R"("tie_word_embeddings": true)");
  auto named = m.named_parameters();
  EXPECT_EQ(named.front().first, "model.embed_tokens.weight");
  EXPECT_EQ(named.back().first, "model.norm.weight");  // tied: no lm_head entry
  int64_t n = 0;
  for (auto& [name, p] : named) {
    EXPECT_TRUE(p.is_leaf() && p.requires_grad()) << name;
    n += p.numel();
  }
  EXPECT_EQ(n, m.config().num_parameters());
  bool has_bias = false;
  for (auto& [name, p] : named) has_bias |= name == "model.layers.1.self_attn.k_proj.bias";
  EXPECT_TRUE(has_bias);
  m.set_requires_grad(false);
  for (auto& p : m.parameters()) EXPECT_FALSE(p.requires_grad());
}

TEST(ModelUnit, BadCallsThrowInsteadOfCrashing) {
  CausalLM m = random_model("llama");
  at::Tensor ids = at::randint(0, 300, {2, 6}, at::kLong);
  EXPECT_THROW(m.forward(at::full({1, 3}, 300, at::kLong)), std::exception);  // id == vocab
  EXPECT_THROW(m.forward(at::zeros({6}, at::kLong)), std::exception);        // not [B, T]
  EXPECT_THROW(m.forward(ids, at::ones({2, 5}, at::kLong)), std::exception);  // mask shape
  EXPECT_THROW(m.log_probs(ids, {}, {}, ids), std::exception);                // R = T > T - 1
  EXPECT_THROW(m.log_probs(ids, {}, {}, ids.narrow(1, 1, 5), {0.0, false, 4}), ValueError);
  EXPECT_THROW(m.log_probs(ids, {}, {}, ids.narrow(1, 1, 5), {1.0, false, 0}), ValueError);
  EXPECT_THROW(m.new_cache(0, 4), ValueError);
  EXPECT_THROW(CausalLM(m.config(), at::kLong), ValueError);
}

// ---- config.json ----

TEST(ModelConfig, AcceptsOldAndNewRopeSpellings) {
  auto old = ModelConfig::from_json(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
      "rope_theta": 500000.0, "torch_dtype": "bfloat16",
      "rope_scaling": {"type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}})",
                                    "old.json");
  EXPECT_EQ(old.rope_theta, 500000.0);
  EXPECT_EQ(old.rope_scaling.type, "llama3");
  EXPECT_EQ(old.rope_scaling.original_max_position_embeddings, 8192);
  EXPECT_EQ(old.dtype, "bfloat16");
  EXPECT_EQ(old.head_dim, 4);
  std::string saved = old.to_json("float32");
  EXPECT_NE(saved.find("\"torch_dtype\": \"float32\""), std::string::npos);
  auto qwen = ModelConfig::from_json(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8,
      "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2, "rope_scaling": null,
      "rope_theta": 1000000.0, "use_sliding_window": false, "sliding_window": 4096})",
                                     "qwen.json");
  EXPECT_EQ(qwen.num_key_value_heads, 2);
  EXPECT_EQ(qwen.head_dim, 4);
  EXPECT_EQ(ModelConfig::from_json(test::tiny_config_json("qwen2", R"("head_dim": 10)"), "c").head_dim, 10);
  EXPECT_EQ(ModelConfig::from_json(test::tiny_config_json("llama", R"("head_dim": null)"), "c").head_dim, 8);
  EXPECT_EQ(qwen.rope_theta, 1e6);
  EXPECT_TRUE(qwen.qkv_bias);
  EXPECT_NE(describe(qwen).find("parameters: "), std::string::npos);
}

TEST(ModelConfig, RejectsUnsupportedOrInvalidValuesNamingFileAndKey) {
  auto base = [](const std::string& extra) { return test::tiny_config_json("qwen3", extra); };
  struct Bad {
    std::string text, needle;
  };
  std::vector<Bad> cases = {
      {R"({"model_type": "mistral", "vocab_size": 10})", "model_type: got 'mistral'"},
      {base(R"("use_sliding_window": true, "max_window_layers": 1)"), "use_sliding_window"},
      {base(R"("hidden_act": "gelu")"), "hidden_act"},
      {base(R"("attention_bias": true)"), "attention_bias"},
      {test::tiny_config_json("qwen2", R"("num_key_value_heads": 4)"), "num_key_value_heads"},
      {base(R"("rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0})"), "rope_type: got 'yarn'"},
      {R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 1, "num_attention_heads": 2, "rms_norm_eps": NaN})", "not valid JSON"},
      {R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
          "num_hidden_layers": 1, "num_attention_heads": 2, "rms_norm_eps": -1e-6})", "rms_norm_eps"},
      {R"({"model_type": "qwen2", "vocab_size": 10.5, "hidden_size": 8})", "vocab_size"},
      {R"({"model_type": "qwen2", "hidden_size": 8})", "vocab_size: missing"},
      {"[1, 2]", "expected a JSON object"},
      {test::tiny_config_json("qwen2", R"("vocab_size": 1099511627776, "hidden_size": 1099511627776,
                                           "num_attention_heads": 4)"), "2^50"},
  };
  for (const auto& c : cases) {
    try {
      ModelConfig::from_json(c.text, "/m/config.json");
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const FormatError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("/m/config.json"), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
    }
  }
}

}  // namespace
}  // namespace rpg::model

namespace rpg::model {
namespace {

// The same model on each test device agrees with the CPU in every forward mode (on CUDA
// fused SDPA kernels replace the CPU ones, so fp32 tolerances are those of differently
// ordered fp32 sums; TF32 is off by default in libtorch matmuls). On the CPU this compares
// two CPU copies made through copy_parameters_from.
class MatchesCpu : public ::testing::TestWithParam<at::Device> {};
INSTANTIATE_TEST_SUITE_P(Devices, MatchesCpu, ::testing::ValuesIn(rpg::test::rpg_test_devices()), rpg::test::DeviceParamName());

TEST_P(MatchesCpu, ForwardDecodeAndLogProbs) {
  const at::Device dev = GetParam();
  CausalLM cpu = test::random_model("qwen3", at::kFloat, "", 31);
  CausalLM gpu(cpu.config(), at::kFloat, dev);
  gpu.copy_parameters_from(cpu);
  auto b = test::padded_batch(cpu.config().vocab_size, 4);
  at::Tensor targets = b.input_ids.narrow(1, b.P, b.R);
  {
    at::NoGradGuard no_grad;
    at::Tensor lc = cpu.forward(b.input_ids, b.attention_mask), lg = gpu.forward(b.input_ids, b.attention_mask);
    EXPECT_TRUE(lg.device() == dev);
    EXPECT_LE(test::max_abs_diff_masked(lg.cpu(), lc, b.attention_mask), 1e-4);
    KVCache cache = gpu.new_cache(2, 16);
    at::Tensor row = b.input_ids.narrow(0, 0, 1);
    at::Tensor d = gpu.decode(cache, {1}, row.narrow(1, 0, 4));
    for (int64_t t = 4; t < row.size(1); ++t) d = at::cat({d, gpu.decode(cache, {1}, row.narrow(1, t, 1))}, 1);
    EXPECT_LE((d.cpu() - cpu.forward(row)).abs().max().item<double>(), 1e-4);
  }
  LogProbOptions o{0.7, true, 5};
  TokenLogProbs pc = cpu.log_probs(b.input_ids, b.attention_mask, b.position_ids, targets, o);
  TokenLogProbs pg = gpu.log_probs(b.input_ids, b.attention_mask, b.position_ids, targets, o);
  at::Tensor resp = b.attention_mask.narrow(1, b.P, b.R);
  EXPECT_LE(test::max_abs_diff_masked(pg.log_probs.cpu(), pc.log_probs, resp), 1e-4);
  EXPECT_LE(test::max_abs_diff_masked(pg.entropy.cpu(), pc.entropy, resp), 1e-4);
  at::Tensor rf = resp.to(at::kFloat);
  (pc.log_probs * rf).sum().backward();
  (pg.log_probs * rf.to(dev)).sum().backward();
  auto a = cpu.named_parameters(), g = gpu.named_parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    double scale = std::max(1.0, a[i].second.grad().abs().max().item<double>());
    EXPECT_LE((g[i].second.grad().cpu() - a[i].second.grad()).abs().max().item<double>() / scale, 1e-4) << a[i].first;
  }
  // bf16 on the device runs and stays near fp32.
  CausalLM bf(cpu.config(), at::kBFloat16, dev);
  bf.copy_parameters_from(cpu);
  at::NoGradGuard no_grad;
  EXPECT_LE(test::max_abs_diff_masked(bf.forward(b.input_ids, b.attention_mask).cpu(),
                                      cpu.forward(b.input_ids, b.attention_mask), b.attention_mask),
            5e-2);
}

}  // namespace
}  // namespace rpg::model
