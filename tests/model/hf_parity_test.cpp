// The model against live transformers (tests/oracles/model_hf.py): tiny random models of
// every family built and saved by transformers, our logits / log-probs / entropies on a
// padded verl-layout batch compared with transformers', and our saved checkpoints loaded
// back by transformers.
//
// Tolerances: fp32 1e-4 on logits (different but exact-in-math kernels; observed ~1e-6).
// bf16 2e-2 on logits: every op rounds to 8 mantissa bits (relative 4e-3) and the two
// implementations round at different points (fused SDPA vs transformers' kernels), on
// logits of magnitude ~1. Log-probs at temperature tau inherit twice the logit error
// divided by tau (the target's logit and the log-sum-exp can each move by it).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <fstream>

#include "model_test_util.h"
#include "rpg/model/causal_lm.h"
#include "test_util.h"

namespace rpg::model {
namespace {

namespace fs = std::filesystem;
using test::max_abs_diff_masked;
using test::read_tensors;

struct Spec {
  std::string name;
  bool bf16;              // the model computes in bf16 (on both sides)
  std::optional<at::ScalarType> load_as;
};

const std::vector<Spec> kSpecs = {
    {"qwen2_fp32", false, std::nullopt},         {"qwen2_tied_bf16", true, std::nullopt},
    {"qwen2_fp16file", false, at::kFloat},       {"qwen3_fp32", false, std::nullopt},
    {"qwen3_bf16_sharded", true, std::nullopt},  {"llama3_fp32", false, std::nullopt},
    {"llama3_bf16", true, std::nullopt},
    // Responses of up to 1030 tokens: the padded log-probs' suffix attends without a mask.
    {"qwen2_long_fp32", false, std::nullopt},
};

// Runs the oracle once per test process for all specs.
const fs::path& oracle_dir() {
  static rpg::test::TempDir dir;
  static bool made = [] {
    rpg::test::run_oracle("model_hf.py", {"make", dir.path().string()});
    return true;
  }();
  (void)made;
  return dir.path();
}

TEST(HfParity, LogitsLogProbsAndGreedyMatchTransformersOnPaddedBatches) {
  const fs::path& dir = oracle_dir();
  for (const auto& spec : kSpecs) {
    SCOPED_TRACE(spec.name);
    auto ref = read_tensors(dir / (spec.name + ".ref.safetensors"));
    LoadOptions opt;
    opt.dtype = spec.load_as;
    CausalLM m = CausalLM::from_pretrained(dir / spec.name, opt);
    EXPECT_EQ(m.dtype(), spec.bf16 ? at::kBFloat16 : at::kFloat);
    EXPECT_EQ(m.config().num_parameters(), ref["num_parameters"].item<int64_t>());
    EXPECT_NE(describe(m.config()).find(std::to_string(ref["num_parameters"].item<int64_t>())), std::string::npos);
    at::NoGradGuard no_grad;
    const at::Tensor &ids = ref["input_ids"], &mask = ref["attention_mask"], &pos = ref["position_ids"];
    at::Tensor hf = ref["logits"];
    at::Tensor ours = m.forward(ids, mask, pos).to(at::kFloat);
    ASSERT_EQ(ours.sizes(), hf.sizes());
    const double tol = spec.bf16 ? 2e-2 : 1e-4;
    double diff = max_abs_diff_masked(ours, hf, mask);
    EXPECT_LE(diff, tol) << "max |logit difference| over valid positions";
    std::printf("[ measure  ] %-20s max |logit - transformers| = %.3g (tolerance %.0e, logit scale %.3g)\n",
                spec.name.c_str(), diff, tol, hf.abs().max().item<double>());
    EXPECT_TRUE(at::isfinite(ours).all().item<bool>()) << "padding positions must stay finite";
    // Row 0 has no padding: alone, it takes the plain causal path (no mask tensor).
    ASSERT_TRUE(mask[0].all().item<bool>());
    EXPECT_LE(max_abs_diff_masked(m.forward(ids.narrow(0, 0, 1), mask.narrow(0, 0, 1)), hf.narrow(0, 0, 1),
                                  mask.narrow(0, 0, 1)),
              tol);
    EXPECT_LE(max_abs_diff_masked(m.forward(ids.narrow(0, 0, 1)), hf.narrow(0, 0, 1), mask.narrow(0, 0, 1)), tol);
    // Default position ids (from the mask) are the verl layout the oracle used.
    EXPECT_LE(max_abs_diff_masked(m.forward(ids, mask), hf, mask), tol);

    // Greedy next token. In bf16, logits within the tolerance of the maximum are ties at
    // this precision: our choice must be one of transformers' top choices.
    at::Tensor our_pick = ours.argmax(-1), hf_pick = hf.argmax(-1);
    at::Tensor valid = mask.to(at::kBool);
    if (!spec.bf16) {
      EXPECT_TRUE(our_pick.masked_select(valid).equal(hf_pick.masked_select(valid)));
    } else {
      at::Tensor hf_at_ours = hf.gather(-1, our_pick.unsqueeze(-1)).squeeze(-1);
      at::Tensor gap = (hf.amax(-1) - hf_at_ours).masked_select(valid);
      EXPECT_LE(gap.max().item<double>(), 2 * tol);
      EXPECT_GE(our_pick.masked_select(valid).eq(hf_pick.masked_select(valid)).to(at::kFloat).mean().item<double>(), 0.9);
    }

    // Chunked log-probs / entropies of the response tokens at the oracle's temperature.
    double tau = ref["temperature"].item<double>();
    at::Tensor targets = ref["targets"];
    const int64_t R = targets.size(1), T = ids.size(1);
    at::Tensor resp_mask = mask.narrow(1, T - R, R);
    for (int64_t chunk : {1, 5, 1000}) {
      SCOPED_TRACE(chunk);
      LogProbOptions o{tau, true, chunk};
      TokenLogProbs lp = m.log_probs(ids, mask, pos, targets, o);
      ASSERT_EQ(lp.log_probs.sizes(), targets.sizes());
      double lp_tol = spec.bf16 ? 2 * tol / tau : 1e-4;
      EXPECT_LE(max_abs_diff_masked(lp.log_probs, ref["log_probs"], resp_mask), lp_tol);
      EXPECT_LE(max_abs_diff_masked(lp.entropy, ref["entropy"], resp_mask), lp_tol);
    }
    if (R >= 1024) {
      EXPECT_TRUE(sdpa_backends().count(std::string(spec.bf16 ? "cpu/BFloat16" : "cpu/Float") +
                                        "/causal_from_key_start_offset"))
          << "the long responses' log-probs took the mask";
    }
  }
}

// The training signal: gradients of a policy-gradient-shaped loss (weighted log-probs and
// entropies of the response tokens, through the chunked path and gradient checkpointing)
// equal transformers' autograd gradients for every parameter, fp32 models.
TEST(HfParity, LogProbGradientsMatchTransformers) {
  const fs::path& dir = oracle_dir();
  for (const auto& spec : kSpecs) {
    if (spec.bf16 || spec.load_as) continue;
    SCOPED_TRACE(spec.name);
    auto ref = read_tensors(dir / (spec.name + ".ref.safetensors"));
    CausalLM m = CausalLM::from_pretrained(dir / spec.name);
    for (bool checkpointing : {false, true}) {
      SCOPED_TRACE(checkpointing ? "checkpointing" : "plain");
      m.set_gradient_checkpointing(checkpointing);
      LogProbOptions o{ref["temperature"].item<double>(), true, 3};
      TokenLogProbs lp = m.log_probs(ref["input_ids"], ref["attention_mask"], ref["position_ids"], ref["targets"], o);
      at::Tensor loss = (lp.log_probs * ref["loss_w_lp"]).sum() + (lp.entropy * ref["loss_w_ent"]).sum();
      auto named = m.named_parameters();
      std::vector<at::Tensor> params;
      for (auto& [name, p] : named) params.push_back(p);
      auto grads = torch::autograd::grad({loss}, params);
      double worst = 0;
      for (size_t i = 0; i < named.size(); ++i) {
        auto it = ref.find("grad." + named[i].first);
        ASSERT_NE(it, ref.end()) << named[i].first;
        at::Tensor want = it->second;
        ASSERT_EQ(grads[i].sizes(), want.sizes()) << named[i].first;
        // fp32 sums over every token and vocab entry, scaled to the gradient's size.
        double d = (grads[i] - want).abs().max().item<double>() / std::max(1.0, want.abs().max().item<double>());
        EXPECT_LE(d, 1e-5) << named[i].first;
        worst = std::max(worst, d);
      }
      std::printf("[ measure  ] %-20s %-13s max relative |grad - transformers grad| = %.3g\n", spec.name.c_str(),
                  checkpointing ? "checkpointed" : "plain", worst);
    }
  }
}

// Incremental decoding through the KV cache reproduces the full forward at every position
// of every row, on the transformers-made models (bias, q/k norm, llama3 RoPE, GQA 1-5).
TEST(HfParity, KVCacheDecodeEqualsFullForward) {
  const fs::path& dir = oracle_dir();
  for (const auto& spec : kSpecs) {
    SCOPED_TRACE(spec.name);
    auto ref = read_tensors(dir / (spec.name + ".ref.safetensors"));
    LoadOptions opt;
    opt.dtype = spec.load_as;
    CausalLM m = CausalLM::from_pretrained(dir / spec.name, opt);
    at::NoGradGuard no_grad;
    const at::Tensor &ids = ref["input_ids"], &mask = ref["attention_mask"];
    at::Tensor full = m.forward(ids, mask).to(at::kFloat);
    const int64_t B = ids.size(0), T = ids.size(1);
    // Token lists per row without padding.
    std::vector<std::vector<int64_t>> rows(B);
    std::vector<std::vector<int64_t>> cols(B);  // column of each token in the padded batch
    for (int64_t b = 0; b < B; ++b)
      for (int64_t t = 0; t < T; ++t)
        if (mask[b][t].item<int64_t>()) {
          rows[b].push_back(ids[b][t].item<int64_t>());
          cols[b].push_back(t);
        }
    // Slot b+1 for row b (slot 0 stays unused), prefill 2 tokens per row in one call for
    // rows at different lengths, then one token at a time for the rows that still have
    // tokens: every call mixes slots of different lengths.
    KVCache cache = m.new_cache(B + 1, T + 2);
    double worst = 0;
    std::vector<size_t> done(B, 0);
    auto compare = [&](int64_t b, const at::Tensor& logits_row, size_t first, size_t n) {
      for (size_t k = 0; k < n; ++k) {
        double d = (logits_row[k].to(at::kFloat) - full[b][cols[b][first + k]]).abs().max().item<double>();
        worst = std::max(worst, d);
      }
    };
    std::vector<int64_t> slots;
    std::vector<at::Tensor> toks;
    for (int64_t b = 0; b < B; ++b)
      if (rows[b].size() >= 2) {
        slots.push_back(b + 1);
        toks.push_back(at::tensor({rows[b][0], rows[b][1]}, at::kLong));
      }
    at::Tensor out = m.decode(cache, slots, at::stack(toks));
    for (size_t i = 0; i < slots.size(); ++i) {
      int64_t b = slots[i] - 1;
      compare(b, out[i], 0, 2);
      done[b] = 2;
    }
    while (true) {
      slots.clear();
      toks.clear();
      for (int64_t b = 0; b < B; ++b)
        if (done[b] < rows[b].size()) {
          slots.push_back(b + 1);
          toks.push_back(at::tensor({rows[b][done[b]]}, at::kLong));
        }
      if (slots.empty()) break;
      out = m.decode(cache, slots, at::stack(toks));
      for (size_t i = 0; i < slots.size(); ++i) {
        int64_t b = slots[i] - 1;
        compare(b, out[i], done[b], 1);
        ++done[b];
      }
    }
    for (int64_t b = 0; b < B; ++b) EXPECT_EQ(cache.length(b + 1), static_cast<int64_t>(rows[b].size()));
    EXPECT_EQ(cache.length(0), 0);
    // bf16: the cached path attends over differently shaped operands than the padded
    // forward and rounds at other points; each rounding is half an ulp and the logits come
    // out of a bf16 matmul, so two bf16 ulps at the logits' magnitude is the bound.
    double scale = full.abs().max().item<double>();
    double bf16_ulp = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(scale))) - 7);
    EXPECT_LE(worst, spec.bf16 ? 2 * bf16_ulp : 1e-5);
    std::printf("[ measure  ] %-20s max |cached decode - full forward| = %.3g\n", spec.name.c_str(), worst);
  }
}

bool same_parameters(const CausalLM& a, const CausalLM& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  if (pa.size() != pb.size()) return false;
  for (size_t i = 0; i < pa.size(); ++i)
    if (pa[i].first != pb[i].first || !pa[i].second.equal(pb[i].second)) return false;
  return true;
}

// Checkpoints written by us are read by transformers (no missing / unexpected keys) and
// give the logits of the original model; sharded and single-file, fp32 and bf16, tied.
TEST(HfParity, SavedCheckpointsLoadInTransformersWithIdenticalLogits) {
  const fs::path& dir = oracle_dir();
  rpg::test::TempDir out;
  struct Case {
    std::string name;
    int64_t max_shard_bytes;
    bool expect_sharded;
  };
  const std::vector<Case> cases = {
      {"qwen2_fp32", 40000, true},             // many shards from one file
      {"qwen3_bf16_sharded", int64_t{1} << 30, false},  // shards in, one file out
      {"qwen2_tied_bf16", 20000, true},        // tied: no lm_head tensor written
      {"llama3_fp32", int64_t{1} << 30, false},
  };
  std::vector<std::string> args = {"logits"};
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    CausalLM m = CausalLM::from_pretrained(dir / c.name);
    SaveOptions so;
    so.max_shard_bytes = c.max_shard_bytes;
    so.copy_files_from = dir / c.name;
    fs::path target = out / c.name;
    m.save_pretrained(target, so);
    EXPECT_EQ(fs::exists(target / "model.safetensors.index.json"), c.expect_sharded);
    EXPECT_EQ(fs::exists(target / "model.safetensors"), !c.expect_sharded);
    EXPECT_TRUE(fs::exists(target / "generation_config.json")) << "other files are copied over";
    int n_files = 0;
    for (const auto& e : fs::directory_iterator(target)) n_files += e.path().extension() == ".safetensors";
    if (c.expect_sharded) {
      EXPECT_GT(n_files, 2);
    }
    // Our own reload is bit-identical.
    CausalLM back = CausalLM::from_pretrained(target);
    EXPECT_EQ(back.dtype(), m.dtype());
    EXPECT_TRUE(same_parameters(m, back));
    args.push_back(target.string());
    args.push_back((dir / (c.name + ".ref.safetensors")).string());
    args.push_back((out / (c.name + ".logits.safetensors")).string());
  }
  // Nothing but the final directories in the output folder: the writes were atomic.
  for (const auto& e : fs::directory_iterator(out.path()))
    EXPECT_TRUE(std::find_if(cases.begin(), cases.end(), [&](const Case& c) { return c.name == e.path().filename(); }) !=
                cases.end())
        << "leftover " << e.path();
  rpg::test::run_oracle("model_hf.py", args);
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    auto ref = read_tensors(dir / (c.name + ".ref.safetensors"));
    auto got = read_tensors(out / (c.name + ".logits.safetensors"));
    // Same weights, same program: transformers reproduces its own reference exactly.
    EXPECT_LE(max_abs_diff_masked(got["logits"], ref["logits"], ref["attention_mask"]), 1e-6);
  }

  // fp16 on disk -> fp32 parameters -> fp16 on disk is lossless.
  CausalLM f16 = CausalLM::from_pretrained(dir / "qwen2_fp16file");
  EXPECT_EQ(f16.dtype(), at::kHalf);
  LoadOptions as32;
  as32.dtype = at::kFloat;
  SaveOptions to16;
  to16.dtype = at::kHalf;
  CausalLM::from_pretrained(dir / "qwen2_fp16file", as32).save_pretrained(out / "f16", to16);
  EXPECT_TRUE(same_parameters(f16, CausalLM::from_pretrained(out / "f16")));
  std::ifstream cfg(out / "f16" / "config.json");
  std::string text((std::istreambuf_iterator<char>(cfg)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("\"dtype\": \"float16\""), std::string::npos) << text;
}

}  // namespace
}  // namespace rpg::model
