// The published config.json of the paper's model families (tests/model/real_configs/)
// against live transformers (tests/oracles/model_real_configs.py):
//  - the full-size parameter list (names, shapes, order) and count equal those of the model
//    transformers constructs on the meta device from the same file, and `rpg model info`
//    (describe) prints that count;
//  - each config cut to 2 layers (widths / 8 except the two smallest, vocabulary 1000, every
//    structure key as published: bias, qk-norm, head_dim, GQA ratio, tying, rope theta and
//    llama3 scaling, norm eps) with random weights: logits equal transformers' within 1e-4
//    in fp32 on a padded batch;
//  - the totals agree with the figures the model cards print (an independent check of the
//    fixtures themselves, which were transcribed from the published files).
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "model_test_util.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/model/causal_lm.h"
#include "test_util.h"

namespace rpg::model {
namespace {

namespace fs = std::filesystem;

const std::vector<std::string> kNames = {
    "Qwen2.5-0.5B", "Qwen2.5-1.5B", "Qwen2.5-7B", "Qwen2.5-Math-7B", "Qwen2.5-72B",  "Qwen3-0.6B",
    "Qwen3-4B",     "Qwen3-8B",     "Qwen3-32B",  "Llama-3.1-8B",    "Llama-3.1-70B", "DeepSeek-R1-Distill-Qwen-7B"};

fs::path configs_dir() { return rpg::test::source_dir() / "tests" / "model" / "real_configs"; }

const fs::path& oracle_dir() {
  static const fs::path dir = rpg::test::oracle_output_dir("model_real_configs.py", {configs_dir().string()});
  return dir;
}

ModelConfig published(const std::string& name) {
  fs::path p = configs_dir() / (name + ".json");
  return ModelConfig::from_json(read_file(p), p.string());
}

TEST(RealConfigs, EveryFixtureIsTested) {
  size_t n = 0;
  for (const auto& e : fs::directory_iterator(configs_dir())) n += e.path().extension() == ".json";
  EXPECT_EQ(n, kNames.size());
}

TEST(RealConfigs, ParameterListAndCountEqualTransformersMetaConstruction) {
  for (const auto& name : kNames) {
    SCOPED_TRACE(name);
    ModelConfig c = published(name);
    auto ref = nlohmann::json::parse(read_file(oracle_dir() / (name + ".params.json")));
    // Same names and shapes (transformers lists them in module order, we in checkpoint order).
    std::map<std::string, std::vector<int64_t>> ours, theirs;
    for (auto& [pname, shape] : c.parameter_shapes()) ours[pname] = shape;
    for (const auto& p : ref["parameters"]) theirs[p[0].get<std::string>()] = p[1].get<std::vector<int64_t>>();
    EXPECT_EQ(ours.size(), c.parameter_shapes().size()) << "a name listed twice";
    EXPECT_TRUE(ours == theirs);
    for (const auto& [pname, shape] : theirs) {
      auto it = ours.find(pname);
      if (it == ours.end()) ADD_FAILURE() << "missing " << pname;
      else EXPECT_EQ(it->second, shape) << pname;
    }
    const int64_t n = ref["num_parameters"].get<int64_t>();
    EXPECT_EQ(c.num_parameters(), n);
    EXPECT_NE(describe(c).find("parameters: " + std::to_string(n) + " "), std::string::npos) << describe(c);
    // What transformers resolved from the same file: full attention everywhere, the same
    // RoPE type and theta.
    for (const auto& t : ref["layer_types"]) EXPECT_EQ(t, "full_attention");
    EXPECT_EQ(ref["rope_parameters"]["rope_type"].get<std::string>(), c.rope_scaling.type);
    EXPECT_EQ(ref["rope_parameters"]["rope_theta"].get<double>(), c.rope_theta);
    std::printf("[ measure  ] %-28s %lld parameters (transformers: %lld)\n", name.c_str(),
                static_cast<long long>(c.num_parameters()), static_cast<long long>(n));
  }
}

// The model cards' "Number of Parameters" (and Qwen3's non-embedding count), printed to
// the digit shown; our count must round (or truncate, as the cards do) to it.
TEST(RealConfigs, CountsAgreeWithTheModelCards) {
  struct Card {
    std::string name;
    double billions, unit;  // unit: the last printed digit
    double non_embedding;   // 0: not printed on the card
  };
  const std::vector<Card> cards = {
      {"Qwen2.5-0.5B", 0.49, 0.01, 0.36}, {"Qwen2.5-1.5B", 1.54, 0.01, 1.31}, {"Qwen2.5-7B", 7.61, 0.01, 6.53},
      {"Qwen2.5-72B", 72.7, 0.1, 0},      {"Qwen3-0.6B", 0.6, 0.1, 0.44},     {"Qwen3-4B", 4.0, 0.1, 3.6},
      {"Qwen3-8B", 8.2, 0.1, 6.95},       {"Qwen3-32B", 32.8, 0.1, 31.2},     {"Llama-3.1-8B", 8.03, 0.01, 0},
      {"Llama-3.1-70B", 70.6, 0.1, 0},
  };
  for (const auto& card : cards) {
    SCOPED_TRACE(card.name);
    ModelConfig c = published(card.name);
    double b = c.num_parameters() / 1e9;
    EXPECT_LT(std::abs(b - card.billions), card.unit) << b;
    if (card.non_embedding > 0) {
      double emb = double(c.vocab_size) * c.hidden_size * (c.tie_word_embeddings ? 1 : 2) / 1e9;
      EXPECT_LT(std::abs(b - emb - card.non_embedding), card.unit) << b - emb;
    }
  }
}

TEST(RealConfigs, TwoLayerCutLogitsMatchTransformersFp32) {
  for (const auto& name : kNames) {
    SCOPED_TRACE(name);
    const fs::path dir = oracle_dir() / name;
    auto ref = test::read_tensors(oracle_dir() / (name + ".ref.safetensors"));
    LoadOptions opt;
    opt.dtype = at::kFloat;  // the published config says bfloat16; the weights are fp32
    CausalLM m = CausalLM::from_pretrained(dir, opt);
    // The cut keeps the published structure flags.
    ModelConfig full = published(name);
    EXPECT_EQ(m.config().num_hidden_layers, 2);
    EXPECT_EQ(m.config().qkv_bias, full.qkv_bias);
    EXPECT_EQ(m.config().qk_norm, full.qk_norm);
    EXPECT_EQ(m.config().tie_word_embeddings, full.tie_word_embeddings);
    EXPECT_EQ(m.config().num_attention_heads, full.num_attention_heads);
    EXPECT_EQ(m.config().num_key_value_heads, full.num_key_value_heads);
    EXPECT_EQ(m.config().rope_scaling.type, full.rope_scaling.type);
    EXPECT_EQ(m.config().rope_theta, full.rope_theta);
    EXPECT_EQ(m.config().num_parameters(), ref["num_parameters"].item<int64_t>());
    at::NoGradGuard no_grad;
    const at::Tensor &ids = ref["input_ids"], &mask = ref["attention_mask"], &pos = ref["position_ids"];
    at::Tensor hf = ref["logits"];
    at::Tensor ours = m.forward(ids, mask, pos).to(at::kFloat);
    ASSERT_EQ(ours.sizes(), hf.sizes());
    double diff = test::max_abs_diff_masked(ours, hf, mask);
    EXPECT_LE(diff, 1e-4);
    std::printf("[ measure  ] %-28s 2-layer max |logit - transformers| = %.3g (logit scale %.3g)\n", name.c_str(),
                diff, hf.abs().max().item<double>());
  }
}


// Every config.json key that changes what transformers computes for these families is
// either implemented (the parity tests above) or refused by name. Each case edits one key
// of a published config.
TEST(RealConfigs, KeysThatChangeTheComputationAreRefusedByName) {
  using nlohmann::json;
  auto edit = [](const std::string& name, const json& patch) {
    json j = json::parse(read_file(configs_dir() / (name + ".json")));
    j.update(patch);  // top-level keys replaced; a null value stays null
    return j.dump();
  };
  struct Bad {
    std::string name;
    json patch;
    std::string needle;
  };
  const std::vector<Bad> bad = {
      // sliding-window layers (Qwen2.5's max_window_layers 21 of 28 on the 1.5B; the
      // transformers default window 4096 when the key is absent)
      {"Qwen2.5-1.5B", {{"use_sliding_window", true}}, "use_sliding_window: got true with max_window_layers 21"},
      {"Qwen3-8B", {{"use_sliding_window", true}, {"sliding_window", 4096}, {"max_window_layers", 30}},
       "use_sliding_window"},
      {"Qwen2.5-7B", {{"use_sliding_window", true}, {"max_window_layers", 0}}, "max_window_layers"},
      {"Qwen3-4B", {{"layer_types", json::array({"full_attention", "sliding_attention"})}}, "layer_types"},
      // RoPE variants other than llama3, in both spellings
      {"Qwen2.5-7B", {{"rope_scaling", {{"type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}}},
       "rope_scaling.rope_type: got 'yarn'"},
      {"Qwen3-8B", {{"rope_scaling", {{"rope_type", "yarn"}, {"factor", 4.0}, {"original_max_position_embeddings", 32768}}}},
       "got 'yarn'"},
      {"Llama-3.1-8B", {{"rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}}}, "got 'linear'"},
      {"Llama-3.1-8B", {{"rope_scaling", {{"rope_type", "dynamic"}, {"factor", 2.0}}}}, "got 'dynamic'"},
      {"Qwen3-0.6B", {{"rope_scaling", {{"rope_type", "longrope"}, {"factor", 2.0}}}}, "got 'longrope'"},
      {"Qwen3-0.6B", {{"rope_parameters", {{"rope_type", "default"}, {"rope_theta", 1e6}, {"partial_rotary_factor", 0.5}}}},
       "partial_rotary_factor"},
      // projections and activations
      {"Qwen3-8B", {{"attention_bias", true}}, "attention_bias"},
      {"Llama-3.1-8B", {{"attention_bias", true}}, "attention_bias"},
      {"Llama-3.1-8B", {{"mlp_bias", true}}, "mlp_bias"},
      {"Qwen2.5-0.5B", {{"hidden_act", "gelu"}}, "hidden_act"},
      {"Llama-3.1-8B", {{"pretraining_tp", 2}}, "pretraining_tp"},
      // training-time dropout
      {"Qwen2.5-7B", {{"attention_dropout", 0.1}}, "attention_dropout"},
      {"Qwen3-4B", {{"model_type", "qwen3_moe"}}, "model_type"},
  };
  for (const auto& b : bad) {
    SCOPED_TRACE(b.name + " " + b.patch.dump());
    try {
      ModelConfig::from_json(edit(b.name, b.patch), "/m/config.json");
      ADD_FAILURE() << "accepted";
    } catch (const FormatError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("/m/config.json: "), std::string::npos) << msg;
      EXPECT_NE(msg.find(b.needle), std::string::npos) << msg;
    }
  }
  // Accepted: the same keys where transformers computes plain full attention / no change
  // (use_sliding_window with every layer below max_window_layers, or with a null window;
  // qwen2's attention_bias, which Qwen2 ignores; an all-full layer_types list; llama's
  // sliding keys, which LlamaModel ignores).
  const std::vector<std::pair<std::string, json>> good = {
      {"Qwen2.5-7B", {{"use_sliding_window", true}}},  // max_window_layers 28 = num_hidden_layers
      {"Qwen3-8B", {{"use_sliding_window", true}, {"sliding_window", nullptr}, {"max_window_layers", 0}}},
      {"Qwen2.5-0.5B", {{"attention_bias", true}}},
      {"Qwen3-0.6B", {{"layer_types", json::array({"full_attention", "full_attention"})}}},
      {"Llama-3.1-8B", {{"use_sliding_window", true}, {"max_window_layers", 0}}},
      {"Qwen2.5-7B", {{"attention_dropout", 0}}},
  };
  for (const auto& [name, patch] : good) {
    SCOPED_TRACE(name + " " + patch.dump());
    EXPECT_NO_THROW(ModelConfig::from_json(edit(name, patch), "/m/config.json"));
  }
}

}  // namespace
}  // namespace rpg::model
