// LoRA against live PEFT (tests/oracles/model_lora_peft.py): adapters PEFT made (random A and
// B, so they change the output) on transformers-made Qwen2, Qwen3 and Llama models, loaded
// from PEFT's files; logits and the gradients of every adapter tensor equal PEFT's in fp32
// (plain and gradient-checkpointed, all-linear, a subset of modules, rsLoRA scaling); the
// adapter switched off is the base model exactly; an adapter rpg writes loads in PEFT with the
// same logits; PEFT's merge_and_unload() model computes what the adapted model computes.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "model_test_util.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "tensor_file.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/lora.h"
#include "test_util.h"

namespace rpg::model {
namespace {

namespace fs = std::filesystem;
using test::max_abs_diff_masked;
using test::read_tensors;

const std::vector<std::string> kModels = {"qwen2_fp32", "qwen3_fp32", "llama3_fp32"};
const std::vector<std::string> kCases = {"all", "some", "rslora"};

const fs::path& oracle_dir() {
  static rpg::test::TempDir dir;
  static bool made = [] {
    std::vector<std::string> hf = {"make", (dir / "models").string()}, peft = {"make", dir.path().string(),
                                                                            (dir / "models").string()};
    hf.insert(hf.end(), kModels.begin(), kModels.end());
    peft.insert(peft.end(), kModels.begin(), kModels.end());
    auto a = rpg::test::run_oracle("model_hf.py", hf);
    if (a.exit_code != 0) throw std::runtime_error("model_hf.py: " + a.err);
    auto b = rpg::test::run_oracle("model_lora_peft.py", peft);
    if (b.exit_code != 0) throw std::runtime_error("model_lora_peft.py: " + b.err);
    return true;
  }();
  (void)made;
  return dir.path();
}

// The oracle's loss: next-token log-probs of the batch, weighted, over attended pairs.
at::Tensor loss_of(const at::Tensor& logits, const at::Tensor& ids, const at::Tensor& mask, const at::Tensor& weight) {
  const int64_t T = ids.size(1);
  at::Tensor logp = at::log_softmax(logits.narrow(1, 0, T - 1).to(at::kFloat), -1);
  at::Tensor picked = logp.gather(-1, ids.narrow(1, 1, T - 1).unsqueeze(-1)).squeeze(-1);
  at::Tensor valid = (mask.narrow(1, 0, T - 1) * mask.narrow(1, 1, T - 1)).to(at::kFloat);
  return (picked * valid * weight).sum();
}

TEST(LoraParity, LogitsAndAdapterGradientsEqualPeft) {
  const fs::path& dir = oracle_dir();
  for (const auto& name : kModels) {
    const auto batch = read_tensors(dir / "models" / (name + ".ref.safetensors"));
    const at::Tensor &ids = batch.at("input_ids"), &mask = batch.at("attention_mask"), &pos = batch.at("position_ids");
    for (const auto& c : kCases) {
      SCOPED_TRACE(name + "." + c);
      auto ref = read_tensors(dir / (name + "." + c + ".ref.safetensors"));
      CausalLM m = CausalLM::from_pretrained(dir / "models" / name);
      m.set_requires_grad(false);
      load_lora_adapter(m, dir / (name + "." + c));
      ASSERT_TRUE(m.lora());
      EXPECT_EQ(m.lora()->use_rslora, c == "rslora");
      const auto adapters = m.lora_parameters();
      ASSERT_EQ(adapters.size() + 3, ref.size()) << "one gradient per adapter tensor (+ logits, loss, weight)";
      for (bool checkpointing : {false, true}) {
        SCOPED_TRACE(checkpointing ? "checkpointing" : "plain");
        m.set_gradient_checkpointing(checkpointing);
        at::Tensor logits = m.forward(ids, mask, pos);
        EXPECT_LE(max_abs_diff_masked(logits, ref.at("logits"), mask), 1e-5);
        at::Tensor loss = loss_of(logits, ids, mask, ref.at("loss_weight"));
        EXPECT_NEAR(loss.item<double>(), ref.at("loss").item<double>(), 1e-4 * std::max(1.0, std::abs(loss.item<double>())));
        std::vector<at::Tensor> params;
        for (const auto& [n, p] : adapters) params.push_back(p);
        auto grads = torch::autograd::grad({loss}, params);
        double worst = 0;
        for (size_t i = 0; i < adapters.size(); ++i) {
          const at::Tensor& want = ref.at("grad." + adapters[i].first);
          ASSERT_EQ(grads[i].sizes(), want.sizes()) << adapters[i].first;
          const double d = (grads[i] - want).abs().max().item<double>() / std::max(1.0, want.abs().max().item<double>());
          EXPECT_LE(d, 1e-5) << adapters[i].first;
          worst = std::max(worst, d);
        }
        std::printf("[ measure  ] %-12s %-7s %-13s max relative |grad - PEFT grad| = %.3g over %zu adapter tensors\n",
                    name.c_str(), c.c_str(), checkpointing ? "checkpointed" : "plain", worst, adapters.size());
      }
      // The KV-cache decode (the rollout engine's path) runs the adapters too: a prefill of
      // row 0 (no padding) gives the full forward's logits.
      at::NoGradGuard no_grad;
      ASSERT_TRUE(mask[0].all().item<bool>());
      KVCache cache = m.new_cache(1, ids.size(1));
      at::Tensor decoded = m.decode(cache, {0}, ids.narrow(0, 0, 1));
      EXPECT_LE((decoded - ref.at("logits").narrow(0, 0, 1)).abs().max().item<double>(), 1e-5);
    }
  }
}

// A bf16 base with fp32 adapters (rpg train's LoRA with compute_dtype=bfloat16) computes as
// PEFT does for a bf16 model by default (autocast_adapter_dtype: the adapter branch in fp32,
// the sum rounded to bf16): logits within bf16's 2e-2 (as the bf16 HF parity tests), the
// loss and every adapter gradient (fp32) within 2e-2 of their scale.
TEST(LoraParity, Fp32AdaptersOnABf16BaseComputeAsPeft) {
  const fs::path& dir = oracle_dir();
  for (const std::string name : {"qwen2_fp32", "llama3_fp32"}) {
    SCOPED_TRACE(name);
    const fs::path ref_file = dir / "models" / (name + ".ref.safetensors"), out = dir / (name + ".bf16.safetensors");
    // The make case's loss weight, beside the batch.
    auto batch = read_tensors(ref_file);
    batch["loss_weight"] = read_tensors(dir / (name + ".all.ref.safetensors")).at("loss_weight");
    const fs::path with_weight = dir / (name + ".bf16_in.safetensors");
    rpg::test::save_tensors(with_weight, batch);
    auto r = rpg::test::run_oracle("model_lora_peft.py", {"bf16", (dir / "models" / name).string(),
                                                          (dir / (name + ".all")).string(), with_weight.string(), out.string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto ref = read_tensors(out);
    const at::Tensor &ids = batch.at("input_ids"), &mask = batch.at("attention_mask"), &pos = batch.at("position_ids");
    CausalLM m = CausalLM::from_pretrained(dir / "models" / name, {at::kBFloat16, at::kCPU});
    m.set_requires_grad(false);
    load_lora_adapter(m, dir / (name + ".all"), at::kFloat);
    const auto adapters = m.lora_parameters();
    for (const auto& [n, p] : adapters) ASSERT_EQ(p.scalar_type(), at::kFloat) << n;
    at::Tensor logits = m.forward(ids, mask, pos);
    EXPECT_EQ(logits.scalar_type(), at::kBFloat16);
    EXPECT_LE(max_abs_diff_masked(logits.to(at::kFloat), ref.at("logits"), mask), 2e-2);
    at::Tensor loss = loss_of(logits, ids, mask, batch.at("loss_weight"));
    EXPECT_NEAR(loss.item<double>(), ref.at("loss").item<double>(), 2e-2 * std::max(1.0, std::abs(loss.item<double>())));
    std::vector<at::Tensor> params;
    for (const auto& [n, p] : adapters) params.push_back(p);
    auto grads = torch::autograd::grad({loss}, params);
    ASSERT_EQ(adapters.size() + 2, ref.size());
    for (size_t i = 0; i < adapters.size(); ++i) {
      const at::Tensor& want = ref.at("grad." + adapters[i].first);
      EXPECT_EQ(grads[i].scalar_type(), at::kFloat);
      const double d = (grads[i] - want).abs().max().item<double>() / std::max(1e-6, want.abs().max().item<double>());
      EXPECT_LE(d, 2e-2) << adapters[i].first;
    }
  }
}

TEST(LoraParity, AdapterOffIsTheBaseModelExactly) {
  const fs::path& dir = oracle_dir();
  const auto batch = read_tensors(dir / "models" / "qwen3_fp32.ref.safetensors");
  const at::Tensor &ids = batch.at("input_ids"), &mask = batch.at("attention_mask");
  at::NoGradGuard no_grad;
  const CausalLM base = CausalLM::from_pretrained(dir / "models" / "qwen3_fp32");
  const at::Tensor want = base.forward(ids, mask);
  CausalLM m = CausalLM::from_pretrained(dir / "models" / "qwen3_fp32");
  load_lora_adapter(m, dir / "qwen3_fp32.all");
  EXPECT_GT((m.forward(ids, mask) - want).abs().max().item<double>(), 1e-3) << "the adapter must change the output";
  m.set_lora_enabled(false);
  EXPECT_FALSE(m.lora_enabled());
  EXPECT_TRUE(m.forward(ids, mask).equal(want)) << "adapter off must be the base model bit for bit";
  m.set_lora_enabled(true);
  EXPECT_FALSE(m.forward(ids, mask).equal(want));
  // A fresh adapter (B = 0) changes nothing until trained; A is PEFT's Kaiming-uniform.
  CausalLM fresh = CausalLM::from_pretrained(dir / "models" / "qwen3_fp32");
  fresh.attach_lora({8, 16, {"q_proj", "down_proj"}, false});
  EXPECT_TRUE(fresh.forward(ids, mask).equal(want));
  for (const auto& [name, p] : fresh.lora_parameters()) {
    if (name.find("lora_B") != std::string::npos) {
      EXPECT_EQ(p.abs().max().item<double>(), 0.0) << name;
    } else {
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.size(1)));
      EXPECT_LE(p.abs().max().item<double>(), bound) << name;
      EXPECT_GT(p.abs().max().item<double>(), 0.5 * bound) << name;
      EXPECT_TRUE(p.requires_grad()) << name;
    }
  }
  EXPECT_THROW(fresh.attach_lora({8, 16, {"q_proj"}, false}), ValueError);
  CausalLM other = CausalLM::from_pretrained(dir / "models" / "qwen3_fp32");
  EXPECT_THROW(other.attach_lora({0, 16, {"q_proj"}, false}), ValueError);
  EXPECT_THROW(other.attach_lora({4, 16, {"lm_head"}, false}), ValueError);
}

TEST(LoraParity, AnAdapterRpgWritesLoadsInPeftWithTheSameLogitsAndMergesAsPeft) {
  const fs::path& dir = oracle_dir();
  rpg::test::TempDir out;
  for (const auto& name : kModels) {
    SCOPED_TRACE(name);
    const fs::path ref_batch = dir / "models" / (name + ".ref.safetensors");
    const auto batch = read_tensors(ref_batch);
    const at::Tensor &ids = batch.at("input_ids"), &mask = batch.at("attention_mask"), &pos = batch.at("position_ids");
    at::NoGradGuard no_grad;
    CausalLM m = CausalLM::from_pretrained(dir / "models" / name);
    m.attach_lora({4, 8, {"q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"}, false});
    // Trained-looking adapters: B away from zero.
    for (auto& [n, p] : m.lora_parameters()) p.normal_(0.0, 0.05);
    const at::Tensor ours = m.forward(ids, mask, pos);
    const fs::path adapter = out / (name + ".adapter");
    save_lora_adapter(m, adapter, (dir / "models" / name).string());
    const fs::path logits = out / (name + ".peft_logits.safetensors");
    auto r = rpg::test::run_oracle("model_lora_peft.py",
                              {"logits", (dir / "models" / name).string(), adapter.string(), ref_batch.string(), logits.string()});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    EXPECT_LE(max_abs_diff_masked(ours, read_tensors(logits).at("logits"), mask), 1e-5);
    // And back into rpg: the same tensors.
    CausalLM again = CausalLM::from_pretrained(dir / "models" / name);
    load_lora_adapter(again, adapter);
    const auto a = m.lora_parameters(), b = again.lora_parameters();
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(a[i].second.equal(b[i].second)) << a[i].first;
  }
  // PEFT's merge_and_unload() of its own adapter: a plain model computing the adapted logits.
  const std::string name = "llama3_fp32";
  const auto batch = read_tensors(dir / "models" / (name + ".ref.safetensors"));
  at::NoGradGuard no_grad;
  CausalLM merged = CausalLM::from_pretrained(dir / (name + ".all.merged"));
  EXPECT_LE(max_abs_diff_masked(merged.forward(batch.at("input_ids"), batch.at("attention_mask"), batch.at("position_ids")),
                                read_tensors(dir / (name + ".all.ref.safetensors")).at("logits"), batch.at("attention_mask")),
            1e-5);
}

TEST(LoraParity, AdapterFilesRpgCannotComputeAreOneLineFormatErrors) {
  const fs::path& dir = oracle_dir();
  const fs::path source = dir / "qwen2_fp32.some";
  const std::string config = read_file(source / "adapter_config.json");
  auto with = [&](const std::function<void(nlohmann::json&)>& edit, const fs::path& where) {
    fs::create_directories(where);
    fs::copy_file(source / "adapter_model.safetensors", where / "adapter_model.safetensors",
                  fs::copy_options::overwrite_existing);
    auto j = nlohmann::json::parse(config);
    edit(j);
    rpg::test::write_text(where / "adapter_config.json", j.dump());
    return where;
  };
  rpg::test::TempDir tmp;
  struct Case {
    std::string name;
    std::function<void(nlohmann::json&)> edit;
    std::string expect;
  };
  const std::vector<Case> cases = {
      {"dora", [](auto& j) { j["use_dora"] = true; }, "use_dora=true is not supported"},
      {"bias", [](auto& j) { j["bias"] = "all"; }, "bias=\"all\" is not supported"},
      {"save", [](auto& j) { j["modules_to_save"] = {"lm_head"}; }, "modules_to_save"},
      {"pattern", [](auto& j) { j["rank_pattern"] = {{"q_proj", 8}}; }, "rank_pattern"},
      {"regex", [](auto& j) { j["target_modules"] = ".*proj"; }, "regular expressions are not supported"},
      {"module", [](auto& j) { j["target_modules"] = {"q_proj", "lm_head"}; }, "\"lm_head\" is not one of"},
      {"rank", [](auto& j) { j["r"] = 0; }, "r must be an integer >= 1"},
      {"layers", [](auto& j) { j["target_modules"] = {"q_proj", "v_proj", "model.layers.0.mlp.down_proj"}; },
       "down_proj adapters on 1 of 3 layers"},
      {"path", [](auto& j) { j["target_modules"] = {"model.layers.0.mlp.q_proj"}; }, "is not one of"},
      {"type", [](auto& j) { j["peft_type"] = "IA3"; }, "is not LORA"},
      {"fewer", [](auto& j) { j["target_modules"] = {"q_proj"}; }, "unexpected tensor"},
      {"more", [](auto& j) { j["target_modules"] = {"q_proj", "v_proj", "down_proj", "up_proj"}; }, "missing tensor"},
  };
  for (const auto& c : cases) {
    CausalLM m = CausalLM::from_pretrained(dir / "models" / "qwen2_fp32");
    try {
      load_lora_adapter(m, with(c.edit, tmp / c.name));
      ADD_FAILURE() << c.name << ": no error";
    } catch (const FormatError& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
      EXPECT_NE(msg.find(c.expect), std::string::npos) << c.name << ": " << msg;
      EXPECT_NE(msg.find(c.name), std::string::npos) << c.name << ": the message names the file: " << msg;
    }
  }
}

}  // namespace
}  // namespace rpg::model

namespace rpg::model {
namespace {

// `rpg model merge` on PEFT's own adapter: the weights of PEFT's merge_and_unload(), and a
// directory transformers loads (model_hf.py logits fails on a missing or unexpected weight)
// computing the adapted model's logits.
TEST(LoraCli, ModelMergeEqualsPeftsMergeAndLoadsInTransformers) {
  const fs::path& dir = oracle_dir();
  rpg::test::TempDir out;
  const std::string name = "qwen2_fp32";
  const fs::path merged = out / "merged";
  auto r = rpg::test::run_process({rpg::test::rpg_binary().string(), "model", "merge", (dir / "models" / name).string(),
                                   (dir / (name + ".all")).string(), merged.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  const CausalLM ours = CausalLM::from_pretrained(merged), peft = CausalLM::from_pretrained(dir / (name + ".all.merged"));
  EXPECT_FALSE(ours.lora());
  const auto a = ours.named_parameters(), b = peft.named_parameters();
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    const double scale = std::max(1.0, b[i].second.abs().max().item<double>());
    EXPECT_LE((a[i].second - b[i].second).abs().max().item<double>(), 1e-6 * scale) << a[i].first;
  }
  const fs::path ref = dir / "models" / (name + ".ref.safetensors"), logits = out / "logits.safetensors";
  auto t = rpg::test::run_oracle("model_hf.py", {"logits", merged.string(), ref.string(), logits.string()});
  ASSERT_EQ(t.exit_code, 0) << t.err;
  EXPECT_LE(max_abs_diff_masked(read_tensors(logits).at("logits"),
                                read_tensors(dir / (name + ".all.ref.safetensors")).at("logits"),
                                read_tensors(ref).at("attention_mask")),
            1e-5);
  // An adapter that does not fit the base is one line naming the file, and nothing is written.
  auto bad = rpg::test::run_process({rpg::test::rpg_binary().string(), "model", "merge",
                                     (dir / "models" / "qwen3_fp32").string(), (dir / (name + ".all")).string(),
                                     (out / "never").string()});
  EXPECT_EQ(bad.exit_code, 1) << bad.err;
  EXPECT_NE(bad.err.find("adapter_model.safetensors"), std::string::npos) << bad.err;
  EXPECT_FALSE(fs::exists(out / "never"));
}

}  // namespace
}  // namespace rpg::model
