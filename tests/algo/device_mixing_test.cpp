// Device placement of the pure tensor math of algo/ without a GPU: every input on PyTorch's
// "meta" device (shapes only, no storage). Meta, like CUDA, refuses to combine its tensors
// with a CPU tensor of one or more dimensions ("Tensor on device cpu is not on the expected
// device meta!"), so a tensor created on the CPU by at::tensor / at::zeros / ... without the
// inputs' device, then mixed with them, throws here as it would on trainer.device=cuda.
// Only 0-dim CPU tensors may be mixed in (PyTorch allows those on CUDA too). The C++ library
// has no meta kernel for a few operators algo/ uses (Python registers them in
// torch/_meta_registrations.py); this file registers them for the test, with CUDA's device
// rules: where.self is a TensorIterator op (one device; 0-dim CPU tensors allowed),
// index_select's CUDA wrapper requires self and index on the same device; abs and std
// (full reduction) take one tensor. Functions that
// need values (.item(): masked_var / masked_whiten and so rfpp / rfppb, loss_normaliser) cannot
// run on meta and are not covered here. Group ids stay on the host (verl passes them as a numpy
// array next to scores on the GPU): the estimators must bring what they derive from them to the
// scores' device.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <torch/library.h>

#include <functional>
#include <string>

#include "rpg/algo/advantage.h"
#include "rpg/algo/aggregate.h"
#include "rpg/algo/fork_loss.h"
#include "rpg/algo/kl.h"
#include "rpg/algo/policy_loss.h"

namespace {

// CUDA's rule for a TensorIterator operand: the common device, or a 0-dim CPU tensor.
void check_operand(const at::Tensor& t, const char* op, const char* arg) {
  if (t.is_meta() || (t.is_cpu() && t.dim() == 0)) return;
  TORCH_CHECK(false, "Expected all tensors to be on the same device, but found at least two devices, meta and ",
              t.device(), "! (when checking argument ", arg, " in method ", op, ")");
}

at::Tensor meta_where(const at::Tensor& condition, const at::Tensor& self, const at::Tensor& other) {
  check_operand(condition, "where", "condition");
  check_operand(self, "where", "self");
  check_operand(other, "where", "other");
  const auto shape = at::infer_size(at::infer_size(condition.sizes(), self.sizes()), other.sizes());
  return at::empty(shape, at::TensorOptions().dtype(at::result_type(self, other)).device(at::kMeta));
}

at::Tensor meta_index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  TORCH_CHECK(index.device() == self.device(), "Expected all tensors to be on the same device, but found at least two devices, ",
              self.device(), " and ", index.device(), "! (when checking argument index in method index_select)");
  TORCH_CHECK(index.dim() <= 1, "index_select(): Index is supposed to be a vector");
  auto sizes = self.sizes().vec();
  dim = at::maybe_wrap_dim(dim, self.dim());
  sizes[static_cast<size_t>(dim)] = index.numel();
  return at::empty(sizes, self.options());
}

at::Tensor meta_abs(const at::Tensor& self) { return at::empty_like(self); }

at::Tensor meta_std(const at::Tensor& self, at::OptionalIntArrayRef dim, const std::optional<at::Scalar>&, bool keepdim) {
  TORCH_CHECK(!dim.has_value() && !keepdim, "meta std: only the full reduction is implemented here");
  return at::empty({}, self.options());
}

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("where.self", meta_where);
  m.impl("index_select", meta_index_select);
  m.impl("abs", meta_abs);
  m.impl("std.correction", meta_std);
}

}  // namespace

namespace rpg::algo {
namespace {

constexpr int64_t B = 6, T = 5;

at::Tensor meta(at::ScalarType dtype = at::kFloat) { return at::empty({B, T}, at::TensorOptions().dtype(dtype).device(at::kMeta)); }

// Runs f; any exception fails the test with its message (a device mismatch reads "... is not
// on the expected device meta!" or "Expected all tensors to be on the same device").
void runs_on_meta(const std::string& what, const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": " << e.what();
  }
}

void expect_on_meta(const std::string& what, const at::Tensor& t) {
  ASSERT_TRUE(t.defined()) << what;
  EXPECT_TRUE(t.is_meta()) << what << " is on " << t.device();
}

PolicyLossInputs meta_inputs(bool extras) {
  PolicyLossInputs in;
  in.log_probs = meta().requires_grad_(true);
  in.old_log_probs = meta();
  in.advantages = meta();
  in.response_mask = meta(at::kLong);
  if (extras) {
    in.ref_log_probs = meta();
    in.rollout_log_probs = meta();
    in.entropy = meta().requires_grad_(true);
  }
  in.normaliser = 17.0;  // loss_normaliser() needs values; any positive count will do
  return in;
}

TEST(DeviceMixing, EveryPolicyLossStaysOnTheInputsDevice) {
  for (const auto& name : policy_loss_names()) {
    for (bool extras : {false, true})
      for (auto agg : {LossAggMode::TokenMean, LossAggMode::SeqMeanTokenSum, LossAggMode::SeqMeanTokenMean,
                       LossAggMode::SeqMeanTokenSumNorm})
        for (auto rc : {RolloutCorrection::None, RolloutCorrection::Token, RolloutCorrection::Sequence}) {
          if (rc != RolloutCorrection::None && !extras) continue;
          for (auto kl : {Divergence::FKL, Divergence::RKL, Divergence::UFKL, Divergence::URKL})
            for (bool clip : {false, true}) {
              PolicyLossConfig c;
              c.loss_agg_mode = agg;
              c.rollout_correction = rc;
              c.kl = kl;
              c.clip = clip;
              c.kl_coef = extras ? 0.1 : 0.0;
              c.entropy_coeff = extras ? 0.01 : 0.0;
              const std::string what = name + (extras ? " +ref/rollout/entropy " : " ") + to_string(agg) + " " +
                                       to_string(rc) + " " + to_string(kl) + (clip ? " clip" : "");
              runs_on_meta(what, [&] {
                auto out = compute_policy_loss(name, meta_inputs(extras), c);
                expect_on_meta(what + " loss", out.loss);
                for (const auto& [k, v] : out.metrics) expect_on_meta(what + " " + k, v);
              });
            }
        }
  }
}

TEST(DeviceMixing, ForkLossesStayOnTheInputsDevice) {
  for (const auto& kl_type : fork_kl_penalty_registry().names()) {
    for (auto agg : {LossAggMode::TokenMean, LossAggMode::SeqMeanTokenSum, LossAggMode::SeqMeanTokenMean})
      for (bool iterative : {false, true}) {
        ForkLossConfig c;
        c.loss_agg_mode = agg;
        c.use_kl_loss = true;
        c.kl_loss_coef = 0.05;
        c.kl_loss_type = kl_type;
        c.use_iterative_ref_model = iterative;
        c.entropy_coeff = 0.01;
        const std::string what = "fork " + kl_type + " " + to_string(agg) + (iterative ? " iterative" : "");
        runs_on_meta(what, [&] {
          auto in = meta_inputs(true);
          auto out = fork_micro_batch_loss(in, c);
          expect_on_meta(what + " loss", out.loss);
          expect_on_meta(what + " mini-batch", fork_mini_batch_loss(in, c, {{0, 2, 4}, {1, 3, 5}}, false, B, 3));
          expect_on_meta(what + " kl_penalty", fork_kl_penalty(in.log_probs, in.ref_log_probs, kl_type));
        });
      }
  }
}

TEST(DeviceMixing, KlAggregationAndCorrectionStayOnTheInputsDevice) {
  for (auto e : {KlEstimator::K1, KlEstimator::Abs, KlEstimator::K2, KlEstimator::K3, KlEstimator::LowVarKl}) {
    runs_on_meta("kl_estimate " + to_string(e), [&] { expect_on_meta("kl", kl_estimate(meta(), meta(), e)); });
    runs_on_meta("apply_kl_penalty " + to_string(e), [&] {
      expect_on_meta("scores", apply_kl_penalty(meta(), meta(), meta(), meta(at::kLong), 0.1, e));
    });
  }
  for (auto rc : {RolloutCorrection::None, RolloutCorrection::Token, RolloutCorrection::Sequence})
    runs_on_meta("rollout_correction_weights " + to_string(rc), [&] {
      expect_on_meta("rho", rollout_correction_weights(meta(), meta(), meta(at::kLong), rc, 2.0));
    });
  runs_on_meta("masked_sum / masked_mean", [&] {
    expect_on_meta("sum", masked_sum(meta(), meta(at::kLong)));
    expect_on_meta("mean", masked_mean(meta(), meta(at::kBool)));
  });
  for (auto agg : {LossAggMode::TokenMean, LossAggMode::SeqMeanTokenSum, LossAggMode::SeqMeanTokenMean,
                   LossAggMode::SeqMeanTokenSumNorm})
    runs_on_meta("agg_loss " + to_string(agg), [&] { expect_on_meta("agg", agg_loss(meta(), meta(at::kLong), agg, 9.0)); });
}

// The group estimators with the scores on the device and the prompt ids on the host: the
// group statistics (counts, means, stds) must be brought to the scores' device.
TEST(DeviceMixing, GroupAdvantagesTakeHostGroupIdsWithDeviceScores) {
  for (const auto& name : advantage_names()) {
    if (name == "rfpp" || name == "rfppb" || name == "reinforce_plus_plus" || name == "reinforce_plus_plus_baseline")
      continue;  // masked_whiten reads the token count with .item(): needs values
    for (bool norm : {true, false}) {
      AdvantageInputs in;
      in.token_level_rewards = meta();
      in.response_mask = meta(at::kLong);
      in.group_index = at::tensor({0, 0, 0, 1, 1, 2}, at::kLong);  // a singleton group too
      in.norm_adv_by_std_in_grpo = norm;
      const std::string what = name + (norm ? " norm" : "");
      runs_on_meta(what, [&] {
        auto out = compute_advantage(name, in);
        expect_on_meta(what + " advantages", out.advantages);
        expect_on_meta(what + " returns", out.returns);
      });
    }
  }
}

}  // namespace
}  // namespace rpg::algo
