// Internal: the state behind CausalLM, shared by causal_lm.cpp (compute) and
// checkpoint.cpp (load / save). Not part of the public API.
#pragma once

#include <ATen/core/Tensor.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rpg/model/causal_lm.h"

namespace rpg::model {

// A LoRA adapter on one projection: lora_A [r, in], lora_B [out, r] (PEFT's shapes).
struct LoraPair {
  at::Tensor a, b;
};

struct LayerWeights {
  at::Tensor input_norm;                    // [C]
  at::Tensor q_w, q_b, k_w, k_b, v_w, v_b;  // [H*D, C] / [Hkv*D, C]; biases only for qwen2
  at::Tensor o_w;                           // [C, H*D]
  at::Tensor q_norm, k_norm;                // [D], qwen3 only
  at::Tensor post_norm;                     // [C]
  at::Tensor gate_w, up_w, down_w;          // [I, C], [I, C], [C, I]
  // LoRA adapters (attach_lora); undefined on projections without one. lora_scale is
  // alpha / r while the adapters are enabled, 0 when off (the base model exactly).
  LoraPair q_lora, k_lora, v_lora, o_lora, gate_lora, up_lora, down_lora;
  double lora_scale = 0;
};

struct CausalLM::Impl {
  ModelConfig config;
  at::ScalarType dtype;
  at::Device device = at::kCPU;
  at::Tensor embed;       // [V, C]
  std::vector<LayerWeights> layers;
  at::Tensor final_norm;  // [C]
  at::Tensor lm_head;     // [V, C]; the same tensor as embed when tied
  at::Tensor inv_freq;    // [D/2] fp32 RoPE frequencies (after llama3 scaling)
  bool checkpointing = false;
  std::optional<LoraConfig> lora;  // the attached adapters' configuration
  bool lora_enabled = true;
  // Set while a DecodePacks handle lives (pack_weights_for_decode): the weights decode()
  // multiplies by, packed for the CPU GEMM.
  std::shared_ptr<const detail::PackedWeights> decode_packs;

  // Pointers to the parameter members in ModelConfig::parameter_shapes() order.
  std::vector<at::Tensor*> slots();
  // Allocates every parameter (uninitialised) and the RoPE table.
  Impl(ModelConfig cfg, at::ScalarType dt, at::Device dev);
};

}  // namespace rpg::model
