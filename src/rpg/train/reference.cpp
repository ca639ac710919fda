#include "rpg/train/reference.h"

#include <ATen/core/grad_mode.h>

#include <stdexcept>

namespace rpg::train {
namespace {

class Resident final : public ReferencePolicy {
 public:
  Resident(std::unique_ptr<model::CausalLM> copy, const model::CausalLM& policy)
      : copy_(std::move(copy)), policy_(policy) {
    copy_->set_requires_grad(false);
  }
  void with_model(const std::function<void(const model::CausalLM&)>& f) override { f(*copy_); }
  void refresh() override { copy_->copy_parameters_from(policy_); }
  NamedTensors state() const override { return copy_->named_parameters(); }
  bool resident() const override { return true; }

 private:
  std::unique_ptr<model::CausalLM> copy_;
  const model::CausalLM& policy_;
};

// Restores a model's adapter switch when the scope ends, also by an exception.
class AdaptersOff {
 public:
  explicit AdaptersOff(model::CausalLM& m) : m_(m), was_(m.lora_enabled()) { m_.set_lora_enabled(false); }
  ~AdaptersOff() { m_.set_lora_enabled(was_); }
  AdaptersOff(const AdaptersOff&) = delete;
  AdaptersOff& operator=(const AdaptersOff&) = delete;

 private:
  model::CausalLM& m_;
  bool was_;
};

class BaseModel final : public ReferencePolicy {
 public:
  explicit BaseModel(model::CausalLM& policy) : policy_(policy) {}
  void with_model(const std::function<void(const model::CausalLM&)>& f) override {
    AdaptersOff off(policy_);
    f(policy_);
  }
  void refresh() override { throw std::logic_error("the base-model reference of a LoRA run is never refreshed"); }
  NamedTensors state() const override { return {}; }
  bool resident() const override { return false; }

 private:
  model::CausalLM& policy_;
};

class AdapterSnapshot final : public ReferencePolicy {
 public:
  explicit AdapterSnapshot(model::CausalLM& policy) : policy_(policy) {
    for (const auto& [name, t] : policy_.lora_parameters()) {
      snapshot_.emplace_back(name, t.detach().clone());
      held_.push_back(at::empty_like(t));
    }
  }
  void with_model(const std::function<void(const model::CausalLM&)>& f) override {
    const auto live = policy_.lora_parameters();
    at::NoGradGuard no_grad;
    for (size_t i = 0; i < live.size(); ++i) {
      held_[i].copy_(live[i].second);
      live[i].second.detach().copy_(snapshot_[i].second);
    }
    struct Restore {
      const NamedTensors& live;
      std::vector<at::Tensor>& held;
      ~Restore() {
        at::NoGradGuard no_grad;
        for (size_t i = 0; i < live.size(); ++i) live[i].second.detach().copy_(held[i]);
      }
    } restore{live, held_};
    f(policy_);
  }
  void refresh() override {
    at::NoGradGuard no_grad;
    const auto live = policy_.lora_parameters();
    for (size_t i = 0; i < live.size(); ++i) snapshot_[i].second.copy_(live[i].second);
  }
  NamedTensors state() const override { return snapshot_; }
  bool resident() const override { return false; }

 private:
  model::CausalLM& policy_;
  NamedTensors snapshot_;
  std::vector<at::Tensor> held_;  // the live adapters while the snapshot is swapped in
};

}  // namespace

std::unique_ptr<ReferencePolicy> resident_reference(std::unique_ptr<model::CausalLM> copy,
                                                    const model::CausalLM& policy) {
  return std::make_unique<Resident>(std::move(copy), policy);
}

std::unique_ptr<ReferencePolicy> base_model_reference(model::CausalLM& policy) {
  return std::make_unique<BaseModel>(policy);
}

std::unique_ptr<ReferencePolicy> adapter_snapshot_reference(model::CausalLM& policy) {
  return std::make_unique<AdapterSnapshot>(policy);
}

}  // namespace rpg::train
