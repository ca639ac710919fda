// Registry-wide properties, run for every registered policy loss and advantage estimator so
// a new entry is tested for free: finite loss and metrics, zero advantages with beta = 0 give
// a zero gradient, splitting a mini-batch into micro-batches with the global normaliser
// leaves loss and gradient unchanged; unknown or duplicate names are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "algo_test_util.h"
#include "rpg/algo/advantage.h"
#include "rpg/algo/aggregate.h"
#include "rpg/algo/policy_loss.h"
#include "rpg/core/error.h"

namespace rpg::algo {
namespace {

constexpr int64_t B = 6, T = 5;

struct RandomBatch {
  at::Tensor theta;  // [B, T] leaf: log_probs = theta (so d loss / d theta = d loss / d log_probs)
  PolicyLossInputs in;
};

RandomBatch random_batch(uint64_t seed, bool with_extras) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  RandomBatch b;
  auto lengths = at::tensor({5, 3, 1, 4, 5, 2}, at::kLong);
  auto mask = (at::arange(T, at::kLong).unsqueeze(0) < lengths.unsqueeze(1)).to(at::kDouble);
  b.theta = (-at::rand({B, T}, gen, at::kDouble) * 2 - 0.05).requires_grad_(true);
  b.in.log_probs = b.theta * 1.0;
  b.in.old_log_probs = b.theta.detach() - 0.5 * at::randn({B, T}, gen, at::kDouble);
  b.in.advantages = at::randn({B, T}, gen, at::kDouble);
  b.in.response_mask = mask;
  if (with_extras) {
    b.in.ref_log_probs = b.theta.detach() - 0.3 * at::randn({B, T}, gen, at::kDouble);
    b.in.rollout_log_probs = b.in.old_log_probs - 0.1 * at::randn({B, T}, gen, at::kDouble);
    b.in.entropy = b.theta.exp() * 0.5 + 0.1;  // differentiable stand-in for the model's entropy
  }
  return b;
}

PolicyLossInputs rows(const PolicyLossInputs& in, int64_t begin, int64_t end) {
  auto s = [&](const at::Tensor& t) { return t.defined() ? t.slice(0, begin, end) : t; };
  PolicyLossInputs out = in;
  out.log_probs = s(in.log_probs);
  out.old_log_probs = s(in.old_log_probs);
  out.ref_log_probs = s(in.ref_log_probs);
  out.rollout_log_probs = s(in.rollout_log_probs);
  out.advantages = s(in.advantages);
  out.response_mask = s(in.response_mask);
  out.entropy = s(in.entropy);
  return out;
}

PolicyLossConfig full_config() {
  PolicyLossConfig c;
  c.clip_ratio_high = 0.28;
  c.kl_coef = 0.1;
  c.entropy_coeff = 0.01;
  return c;
}


void FiniteLossAndMetrics(const std::string& name) {
  for (bool clip : {true, false})
    for (auto kl : {Divergence::FKL, Divergence::RKL, Divergence::UFKL, Divergence::URKL}) {
      auto b = random_batch(1, true);
      auto c = full_config();
      c.clip = clip;
      c.kl = kl;
      c.rollout_correction = RolloutCorrection::Token;
      b.in.normaliser = loss_normaliser(b.in.response_mask, c.loss_agg_mode);
      auto out = compute_policy_loss(name, b.in, c);
      ASSERT_EQ(out.loss.dim(), 0);
      EXPECT_TRUE(std::isfinite(out.loss.item<double>()));
      auto g = test::grad_of(out.loss, b.theta);
      EXPECT_TRUE(g.isfinite().all().item<bool>());
      // Padding never receives a gradient.
      EXPECT_EQ(g.masked_select(b.in.response_mask == 0).abs().sum().item<double>(), 0.0);
      for (const char* key : {"actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/pg_clipfrac_upper",
                              "actor/ppo_kl", "actor/ratio_mean", "actor/entropy", "actor/ref_kl",
                              "actor/rollout_is_mean"}) {
        ASSERT_TRUE(out.metrics.count(key)) << name << " lacks " << key;
        EXPECT_TRUE(std::isfinite(out.metrics.at(key).item<double>())) << key;
      }
    }
}

void ZeroAdvantagesAndZeroBetaGiveZeroGradient(const std::string& name) {
  for (bool clip : {true, false})
    for (auto kl : {Divergence::FKL, Divergence::RKL, Divergence::UFKL, Divergence::URKL}) {
      auto b = random_batch(2, true);
      b.in.entropy = at::Tensor();
      b.in.advantages = at::zeros({B, T}, at::kDouble);
      PolicyLossConfig c;
      c.clip = clip;
      c.kl = kl;
      c.kl_coef = 0.0;
      b.in.normaliser = loss_normaliser(b.in.response_mask, c.loss_agg_mode);
      auto g = test::grad_of(compute_policy_loss(name, b.in, c).loss, b.theta);
      EXPECT_EQ(g.abs().max().item<double>(), 0.0) << name << " " << to_string(kl) << " clip=" << clip;
    }
}

void MicroBatchSplitKeepsLossAndGradient(const std::string& name) {
  for (auto mode : {LossAggMode::TokenMean, LossAggMode::SeqMeanTokenSum, LossAggMode::SeqMeanTokenMean,
                    LossAggMode::SeqMeanTokenSumNorm})
    for (auto rc : {RolloutCorrection::None, RolloutCorrection::Sequence}) {
      auto b = random_batch(3, true);
      auto c = full_config();
      c.loss_agg_mode = mode;
      c.loss_scale_factor = T;
      c.rollout_correction = rc;
      b.in.normaliser = loss_normaliser(b.in.response_mask, mode);
      auto whole = compute_policy_loss(name, b.in, c).loss;
      auto g_whole = test::grad_of(whole, b.theta);
      at::Tensor sum = at::zeros({}, at::kDouble);
      for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 2}, {2, 3}, {3, 6}})
        sum = sum + compute_policy_loss(name, rows(b.in, begin, end), c).loss;
      auto g_sum = test::grad_of(sum, b.theta);
      EXPECT_NEAR(sum.item<double>(), whole.item<double>(), 1e-12) << name << " " << to_string(mode);
      EXPECT_LT(test::max_abs_diff(g_sum, g_whole), 1e-12) << name << " " << to_string(mode);
      // Using the micro-batch's own normaliser (the accumulation bug) would differ.
      if (mode == LossAggMode::TokenMean && rc == RolloutCorrection::None) {
        at::Tensor buggy = at::zeros({}, at::kDouble);
        for (auto [begin, end] : {std::pair<int64_t, int64_t>{0, 2}, {2, 3}, {3, 6}}) {
          auto part = rows(b.in, begin, end);
          part.normaliser = loss_normaliser(part.response_mask, mode) * 3;  // mean of 3 micro-batch means
          buggy = buggy + compute_policy_loss(name, part, c).loss;
        }
        EXPECT_GT(std::abs(buggy.item<double>() - whole.item<double>()), 1e-6) << name;
      }
    }
}

void EntropyBonusSubtractsAggregatedEntropy(const std::string& name) {
  auto b = random_batch(6, true);
  auto c = full_config();
  c.loss_agg_mode = LossAggMode::SeqMeanTokenMean;
  b.in.normaliser = loss_normaliser(b.in.response_mask, c.loss_agg_mode);
  c.entropy_coeff = 0.0;
  auto base = compute_policy_loss(name, b.in, c).loss;
  c.entropy_coeff = 0.3;
  auto with_bonus = compute_policy_loss(name, b.in, c).loss;
  auto ent = agg_loss(b.in.entropy, b.in.response_mask, c.loss_agg_mode, b.in.normaliser);
  EXPECT_NEAR((with_bonus - base).item<double>(), (-0.3 * ent).item<double>(), 1e-12);
  auto g = test::grad_of(with_bonus - base, b.theta);
  EXPECT_LT(test::max_abs_diff(g, test::grad_of(-0.3 * ent, b.theta)), 1e-12);
}

// The trainer passes float32 log-probs and a bool or integer mask: same result as float64.
void Float32InputsAndBoolMask(const std::string& name) {
  auto b = random_batch(7, true);
  auto c = full_config();
  c.rollout_correction = RolloutCorrection::Token;
  b.in.normaliser = loss_normaliser(b.in.response_mask, c.loss_agg_mode);
  auto ref = compute_policy_loss(name, b.in, c).loss.item<double>();
  auto f = b.in;
  auto theta32 = b.theta.detach().to(at::kFloat).requires_grad_(true);
  f.log_probs = theta32 * 1.0f;
  for (auto* t : {&f.old_log_probs, &f.ref_log_probs, &f.rollout_log_probs, &f.advantages})
    *t = t->to(at::kFloat);
  f.entropy = theta32.exp() * 0.5f + 0.1f;
  for (auto mask : {b.in.response_mask != 0, b.in.response_mask.to(at::kLong)}) {
    f.response_mask = mask;
    auto out = compute_policy_loss(name, f, c);
    EXPECT_EQ(out.loss.scalar_type(), at::kFloat);
    EXPECT_NEAR(out.loss.item<double>(), ref, 1e-4 * (1 + std::abs(ref))) << name;
    EXPECT_TRUE(test::grad_of(out.loss, theta32).isfinite().all().item<bool>());
  }
}

class EveryLoss : public ::testing::TestWithParam<std::string> {};

// One process per registered name (each test process pays libtorch start-up).
TEST_P(EveryLoss, AllProperties) {
  {
    SCOPED_TRACE("FiniteLossAndMetrics");
    FiniteLossAndMetrics(GetParam());
  }
  {
    SCOPED_TRACE("ZeroAdvantagesAndZeroBetaGiveZeroGradient");
    ZeroAdvantagesAndZeroBetaGiveZeroGradient(GetParam());
  }
  {
    SCOPED_TRACE("MicroBatchSplitKeepsLossAndGradient");
    MicroBatchSplitKeepsLossAndGradient(GetParam());
  }
  {
    SCOPED_TRACE("EntropyBonusSubtractsAggregatedEntropy");
    EntropyBonusSubtractsAggregatedEntropy(GetParam());
  }
  {
    SCOPED_TRACE("Float32InputsAndBoolMask");
    Float32InputsAndBoolMask(GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Registered, EveryLoss, ::testing::ValuesIn(policy_loss_names()));

TEST(PolicyLossRegistry, HasThePaperAndBaselineNames) {
  for (const char* name : {"grpo", "grpo_corrected", "dapo", "rfpp", "rfppb", "rloo", "rpg", "rpg_reinforce", "ppo",
                           "vanilla", "gspo", "cispo"})
    EXPECT_TRUE(policy_loss_registry().contains(name)) << name;
}

TEST(PolicyLossRegistry, UnknownNameListsValidNames) {
  auto b = random_batch(4, false);
  b.in.normaliser = 1;
  try {
    compute_policy_loss("rpg_reinforc", b.in, PolicyLossConfig{});
    FAIL() << "no error";
  } catch (const ValueError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("unknown policy_loss 'rpg_reinforc'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("rpg_reinforce"), std::string::npos) << msg;
    EXPECT_NE(msg.find("grpo"), std::string::npos) << msg;
  }
}

PolicyLossOutput dummy_loss(const PolicyLossInputs&, const PolicyLossConfig&) { return {}; }

TEST(PolicyLossRegistry, DuplicateRegistrationIsAnError) {
  Registry<PolicyLossFn> r("policy_loss");
  r.add("x", dummy_loss);
  EXPECT_THROW(r.add("x", dummy_loss), ValueError);
  EXPECT_THROW(r.add("", dummy_loss), ValueError);
}

TEST(PolicyLossInputsCheck, BadInputsAreValueErrors) {
  auto b = random_batch(5, false);
  PolicyLossConfig c;
  EXPECT_THROW(compute_policy_loss("rpg", b.in, c), ValueError);  // normaliser 0
  b.in.normaliser = 10;
  auto bad = b.in;
  bad.advantages = at::zeros({B, T + 1}, at::kDouble);
  EXPECT_THROW(compute_policy_loss("ppo", bad, c), ValueError);
  c.clip_ratio_c = 1.0;
  EXPECT_THROW(compute_policy_loss("ppo", b.in, c), ValueError);
  c = PolicyLossConfig{};
  c.kl = Divergence::FKL;
  c.old_mass = 2.0;
  EXPECT_THROW(compute_policy_loss("rpg", b.in, c), ValueError);
  c = PolicyLossConfig{};
  c.kl_coef = 0.1;
  EXPECT_THROW(compute_policy_loss("grpo", b.in, c), ValueError);  // no ref_log_probs
  c = PolicyLossConfig{};
  c.rollout_correction = RolloutCorrection::Token;
  EXPECT_THROW(compute_policy_loss("ppo", b.in, c), ValueError);  // no rollout_log_probs
  EXPECT_THROW(parse_divergence("jsd"), ValueError);
  EXPECT_THROW(parse_loss_agg_mode("token_mean"), ValueError);
  EXPECT_THROW(parse_kl_estimator("k4"), ValueError);
}

TEST(RolloutCorrection, TruncatedWeights) {
  auto old = at::log(at::tensor({0.5, 0.2, 0.9, 0.3}, at::kDouble)).view({2, 2});
  auto rollout = at::log(at::tensor({0.25, 0.4, 0.3, 0.3}, at::kDouble)).view({2, 2});
  auto mask = at::tensor({1.0, 1.0, 1.0, 0.0}, at::kDouble).view({2, 2});
  auto tok = rollout_correction_weights(old, rollout, mask, RolloutCorrection::Token, 2.5);
  // rho = old / rollout, capped at 2.5; padding -> exp(0) = 1.
  EXPECT_LT(test::max_abs_diff(tok, at::tensor({2.0, 0.5, 2.5, 1.0}, at::kDouble).view({2, 2})), 1e-12);
  auto seq = rollout_correction_weights(old, rollout, mask, RolloutCorrection::Sequence, 2.5);
  EXPECT_LT(test::max_abs_diff(seq, at::tensor({1.0, 1.0, 2.5, 2.5}, at::kDouble).view({2, 2})), 1e-12);
}

// ---- advantage estimators ----

AdvantageInputs random_rewards(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto lengths = at::tensor({5, 3, 1, 4, 5, 2, 4}, at::kLong);
  AdvantageInputs in;
  in.response_mask = (at::arange(T, at::kLong).unsqueeze(0) < lengths.unsqueeze(1)).to(at::kDouble);
  in.token_level_rewards = at::randn({7, T}, gen, at::kDouble) * in.response_mask;
  in.group_index = at::tensor({4, 4, 9, 9, 9, 1, 4}, at::kLong);
  in.gamma = 0.95;
  return in;
}


void FiniteAndZeroOnPadding(const std::string& name) {
  auto in = random_rewards(1);
  auto out = compute_advantage(name, in);
  ASSERT_EQ(out.advantages.sizes(), in.token_level_rewards.sizes());
  EXPECT_TRUE(out.advantages.isfinite().all().item<bool>());
  EXPECT_EQ(out.advantages.masked_select(in.response_mask == 0).abs().sum().item<double>(), 0.0);
  EXPECT_FALSE(out.advantages.requires_grad());
}

void RowOrderDoesNotMatter(const std::string& name) {
  auto in = random_rewards(2);
  auto perm = at::tensor({3, 0, 6, 1, 5, 2, 4}, at::kLong);
  auto shuffled = in;
  shuffled.token_level_rewards = in.token_level_rewards.index_select(0, perm);
  shuffled.response_mask = in.response_mask.index_select(0, perm);
  shuffled.group_index = in.group_index.index_select(0, perm);
  auto a = compute_advantage(name, in).advantages.index_select(0, perm);
  auto b = compute_advantage(name, shuffled).advantages;
  EXPECT_LT(test::max_abs_diff(a, b), 1e-12);
}

void ZeroRewardsGiveZeroAdvantages(const std::string& name) {
  auto in = random_rewards(3);
  in.token_level_rewards = at::zeros_like(in.token_level_rewards);
  EXPECT_EQ(compute_advantage(name, in).advantages.abs().max().item<double>(), 0.0);
}

class EveryEstimator : public ::testing::TestWithParam<std::string> {};

// One process per registered name (each test process pays libtorch start-up).
TEST_P(EveryEstimator, AllProperties) {
  {
    SCOPED_TRACE("FiniteAndZeroOnPadding");
    FiniteAndZeroOnPadding(GetParam());
  }
  {
    SCOPED_TRACE("RowOrderDoesNotMatter");
    RowOrderDoesNotMatter(GetParam());
  }
  {
    SCOPED_TRACE("ZeroRewardsGiveZeroAdvantages");
    ZeroRewardsGiveZeroAdvantages(GetParam());
  }
}

INSTANTIATE_TEST_SUITE_P(Registered, EveryEstimator, ::testing::ValuesIn(advantage_names()));

TEST(AdvantageRegistry, NamesAndErrors) {
  for (const char* name : {"grpo", "drgrpo", "rpg", "rpg_batch", "rloo", "rfpp", "rfppb", "reinforce_plus_plus",
                           "reinforce_plus_plus_baseline"})
    EXPECT_TRUE(advantage_registry().contains(name)) << name;
  auto in = random_rewards(4);
  try {
    compute_advantage("gae", in);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("valid: drgrpo, grpo"), std::string::npos) << e.what();
  }
  auto bad = in;
  bad.group_index = at::tensor({1, 2}, at::kLong);
  EXPECT_THROW(compute_advantage("grpo", bad), ValueError);
}

// Closed-form values on a hand-made batch (independent of verl: the definitions).
TEST(AdvantageRegistry, BaselinesOnAHandMadeBatch) {
  AdvantageInputs in;
  in.response_mask = at::ones({4, 2}, at::kDouble);
  in.token_level_rewards = at::tensor({0.0, 1.0, 0.0, 0.0, 0.0, 3.0, 0.0, 4.0}, at::kDouble).view({4, 2});
  in.group_index = at::tensor({0, 0, 1, 1}, at::kLong);
  // scores 1, 0 | 3, 4; group means 0.5 | 3.5; batch mean 2.
  auto col = [](std::vector<double> v) { return at::tensor(v, at::kDouble).unsqueeze(1).expand({4, 2}); };
  EXPECT_LT(test::max_abs_diff(compute_advantage("rpg", in).advantages, col({0.5, -0.5, -0.5, 0.5})), 1e-12);
  EXPECT_LT(test::max_abs_diff(compute_advantage("rpg_batch", in).advantages, col({-1, -2, 1, 2})), 1e-12);
  // RLOO: s_i - mean of the others.
  EXPECT_LT(test::max_abs_diff(compute_advantage("rloo", in).advantages, col({1, -1, -1, 1})), 1e-12);
  // GRPO: unbiased std of {1, 0} is sqrt(0.5).
  double s = std::sqrt(0.5) + 1e-6;
  EXPECT_LT(test::max_abs_diff(compute_advantage("grpo", in).advantages, col({0.5 / s, -0.5 / s, -0.5 / s, 0.5 / s})),
            1e-12);
}

}  // namespace
}  // namespace rpg::algo
