// The reference policy pi_ref of KL-to-reference losses and of KL in the reward, held in the
// form that costs least:
//   full fine-tuning: a resident copy of the weights;
//   LoRA, fixed reference: the policy itself with its adapters switched off -- the base model,
//     no second copy (verl's ref_in_actor);
//   LoRA, iterative reference: the policy with a snapshot of its adapters swapped in (the base
//     is frozen, so pi_ref differs from the policy only in its adapters).
// Private to src/rpg/train.
#pragma once

#include <functional>
#include <memory>

#include "rpg/model/causal_lm.h"
#include "rpg/train/optim.h"

namespace rpg::train {

class ReferencePolicy {
 public:
  virtual ~ReferencePolicy() = default;
  // Runs `f` on a model that computes pi_ref; the policy is as it was when `f` returns or throws.
  virtual void with_model(const std::function<void(const model::CausalLM&)>& f) = 0;
  // pi_ref <- the policy's current weights (the iterative reference's refresh).
  virtual void refresh() = 0;
  // The live tensors that hold pi_ref's state (what a checkpoint keeps, under "ref.").
  virtual NamedTensors state() const = 0;
  // A second model is resident in memory.
  virtual bool resident() const = 0;
};

// `copy` holds the reference's weights; refresh() copies `policy`'s into it.
std::unique_ptr<ReferencePolicy> resident_reference(std::unique_ptr<model::CausalLM> copy,
                                                    const model::CausalLM& policy);
// `policy` has LoRA adapters: pi_ref is its base (adapters off). refresh() is a logic error.
std::unique_ptr<ReferencePolicy> base_model_reference(model::CausalLM& policy);
// `policy` has LoRA adapters: pi_ref is its base with the adapters' values of the last refresh
// (at first their current values).
std::unique_ptr<ReferencePolicy> adapter_snapshot_reference(model::CausalLM& policy);

}  // namespace rpg::train
