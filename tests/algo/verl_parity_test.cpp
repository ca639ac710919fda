// Parity with verl (the PyPI package in the venv, called live through
// tests/oracles/algo_verl_parity.py): advantage estimators, the PPO clip / dual-clip
// policy loss and its gradient under every loss_agg_mode, GSPO, CISPO, KL estimators and the
// global-normaliser micro-batch aggregation, on random padded batches, to 1e-6.
#include <gtest/gtest.h>

#include "algo_test_util.h"
#include "test_util.h"
#include "rpg/algo/advantage.h"
#include "rpg/algo/aggregate.h"
#include "rpg/algo/policy_loss.h"

namespace rpg::algo {
namespace {

constexpr double kTol = 1e-6;
const char* kModes[] = {"token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"};

struct Batch {
  std::map<std::string, at::Tensor> t;
  double clip_low = 0.2, clip_high = 0.28, clip_c = 3.0, gamma = 0.9, scale = 9.0;
  int64_t split = 3;
};

Batch make_batch(uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  const int64_t B = 8, T = 6;
  Batch b;
  // Right-padded responses of random length 1..T; row 0 full length.
  auto lengths = at::randint(1, T + 1, {B}, gen, at::kLong);
  lengths[0] = T;
  auto positions = at::arange(T, at::kLong).unsqueeze(0);
  auto mask = (positions < lengths.unsqueeze(1)).to(at::kDouble);
  // Outcome reward on the last response token, plus token-level shaping rewards for rfpp.
  auto last = at::one_hot(lengths - 1, T).to(at::kDouble);
  auto outcome = at::where(at::rand({B}, gen, at::kDouble) < 0.5, -1.0, 1.0) + 0.1 * at::randn({B}, gen, at::kDouble);
  auto shaping = 0.2 * at::randn({B, T}, gen, at::kDouble) * (at::rand({B, T}, gen, at::kDouble) < 0.3);
  auto rewards = (outcome.unsqueeze(1) * last + shaping) * mask;
  auto log_probs = -at::rand({B, T}, gen, at::kDouble) * 2 - 0.05;
  // log-ratios spread over all clip regions (w from ~0.3 to ~4).
  auto old = log_probs - 0.6 * at::randn({B, T}, gen, at::kDouble);
  auto ref = log_probs - 0.5 * at::randn({B, T}, gen, at::kDouble);
  auto adv = at::randn({B, T}, gen, at::kDouble);
  // Row 0 (full length) visits every clip region whatever the seed: w = 0.37 with A < 0
  // (lower clip), 1 (band), 1.49 with A > 0 (upper clip), 4.5 with A < 0 (dual clip).
  old.index_put_({0, at::indexing::Slice(0, 4)},
                 log_probs.index({0, at::indexing::Slice(0, 4)}) - at::tensor({-1.0, 0.0, 0.4, 1.5}, at::kDouble));
  adv.index_put_({0, at::indexing::Slice(0, 4)}, at::tensor({-1.0, 1.0, 1.0, -1.0}, at::kDouble));
  b.t["token_level_rewards"] = rewards;
  b.t["response_mask"] = mask;
  b.t["group_index"] = at::tensor({3, 3, 3, 7, 7, 7, 7, 5}, at::kDouble);  // group 5 is a singleton
  b.t["log_probs"] = log_probs;
  b.t["old_log_probs"] = old;
  b.t["ref_log_probs"] = ref;
  b.t["advantages"] = adv;
  b.t["loss_mat"] = at::randn({B, T}, gen, at::kDouble);
  b.t["config"] = at::tensor({b.clip_low, b.clip_high, b.clip_c, b.gamma, static_cast<double>(b.split), b.scale},
                             at::kDouble);
  return b;
}

std::map<std::string, at::Tensor> run_verl(const Batch& b) {
  rpg::test::TempDir dir;
  test::write_tensors(dir / "in.txt", b.t);
  rpg::test::run_oracle("algo_verl_parity.py", {(dir / "in.txt").string(), (dir / "out.txt").string()});
  return test::read_tensors(dir / "out.txt");
}

class VerlParity : public ::testing::TestWithParam<uint64_t> {
 protected:
  void SetUp() override {
    batch_ = make_batch(GetParam());
    verl_ = run_verl(batch_);
  }
  const at::Tensor& verl(const std::string& key) const {
    auto it = verl_.find(key);
    if (it == verl_.end()) throw std::runtime_error("oracle did not produce " + key);
    return it->second;
  }
  PolicyLossConfig config(const char* mode) const {
    PolicyLossConfig c;
    c.clip_ratio_low = batch_.clip_low;
    c.clip_ratio_high = batch_.clip_high;
    c.clip_ratio_c = batch_.clip_c;
    c.loss_agg_mode = parse_loss_agg_mode(mode);
    c.loss_scale_factor = batch_.scale;
    return c;
  }
  // Loss and d loss / d log_probs of our `name` on the batch.
  std::pair<at::Tensor, at::Tensor> ours(const std::string& name, const PolicyLossConfig& c,
                                         std::map<std::string, at::Tensor>* metrics = nullptr) const {
    auto lp = batch_.t.at("log_probs").clone().requires_grad_(true);
    PolicyLossInputs in;
    in.log_probs = lp;
    in.old_log_probs = batch_.t.at("old_log_probs");
    in.advantages = batch_.t.at("advantages");
    in.response_mask = batch_.t.at("response_mask");
    in.normaliser = loss_normaliser(in.response_mask, c.loss_agg_mode);
    auto out = compute_policy_loss(name, in, c);
    if (metrics) *metrics = out.metrics;
    return {out.loss.detach(), test::grad_of(out.loss, lp)};
  }

  void AdvantageEstimators() {
    AdvantageInputs in;
    in.token_level_rewards = batch_.t.at("token_level_rewards");
    in.response_mask = batch_.t.at("response_mask");
    in.group_index = batch_.t.at("group_index").to(at::kLong);
    in.gamma = batch_.gamma;
    for (auto [ours_name, verl_name] : std::vector<std::pair<std::string, std::string>>{
             {"grpo", "grpo"}, {"drgrpo", "drgrpo"}, {"rpg", "drgrpo"}, {"rloo", "rloo"},
             {"rfpp", "rfpp"}, {"rfppb", "rfppb"}, {"reinforce_plus_plus", "rfpp"},
             {"reinforce_plus_plus_baseline", "rfppb"}}) {
      auto out = compute_advantage(ours_name, in);
      EXPECT_LT(test::max_abs_diff(out.advantages, verl("adv/" + verl_name)), kTol) << ours_name;
    }
    EXPECT_LT(test::max_abs_diff(compute_advantage("rfpp", in).returns, verl("ret/rfpp")), kTol);
    auto no_std = in;
    no_std.norm_adv_by_std_in_grpo = false;
    EXPECT_LT(test::max_abs_diff(compute_advantage("grpo", no_std).advantages, verl("adv/drgrpo")), kTol);
  }

  void PpoClipLossGradientAndMetricsInEveryAggMode() {
    for (const char* mode : kModes) {
      std::map<std::string, at::Tensor> metrics;
      auto [loss, grad] = ours("ppo", config(mode), &metrics);
      std::string p = std::string("ppo/") + mode + "/";
      EXPECT_NEAR(loss.item<double>(), verl(p + "loss").item<double>(), kTol) << mode;
      EXPECT_LT(test::max_abs_diff(grad, verl(p + "grad")), kTol) << mode;
      for (const char* key : {"actor/pg_clipfrac", "actor/ppo_kl", "actor/pg_clipfrac_lower"})
        EXPECT_NEAR(metrics.at(key).item<double>(), verl(p + key).item<double>(), kTol) << mode << " " << key;
      // The grid must exercise every branch, or the comparison proves little.
      if (std::string(mode) == "token-mean") {
        EXPECT_GT(metrics.at("actor/pg_clipfrac").item<double>(), 0.0);
        EXPECT_GT(metrics.at("actor/pg_clipfrac_lower").item<double>(), 0.0);
      }
    }
  }

  // RPG-Style Clip without KL is PPO dual-clip: Algorithm 1 gives verl's loss and gradient;
  // Algorithm 2 (a different loss value, -SG(w) A' log pi) gives verl's gradient.
  void RpgClipWithoutKlMatchesPpo() {
    for (const char* mode : kModes) {
      auto c = config(mode);
      c.clip = true;
      c.kl_coef = 0.0;
      std::string p = std::string("ppo/") + mode + "/";
      auto [loss1, grad1] = ours("rpg", c);
      EXPECT_NEAR(loss1.item<double>(), verl(p + "loss").item<double>(), kTol) << mode;
      EXPECT_LT(test::max_abs_diff(grad1, verl(p + "grad")), kTol) << mode;
      auto [loss2, grad2] = ours("rpg_reinforce", c);
      EXPECT_LT(test::max_abs_diff(grad2, verl(p + "grad")), kTol) << mode;
    }
  }

  void GspoAndCispo() {
    for (const char* name : {"gspo", "cispo"}) {
      std::map<std::string, at::Tensor> metrics;
      auto [loss, grad] = ours(name, config("token-mean"), &metrics);
      EXPECT_NEAR(loss.item<double>(), verl(std::string(name) + "/loss").item<double>(), kTol) << name;
      EXPECT_LT(test::max_abs_diff(grad, verl(std::string(name) + "/grad")), kTol) << name;
      EXPECT_NEAR(metrics.at("actor/pg_clipfrac").item<double>(),
                  verl(std::string(name) + "/actor/pg_clipfrac").item<double>(), kTol) << name;
    }
  }

  void KlEstimators() {
    const auto& lp = batch_.t.at("log_probs");
    const auto& ref = batch_.t.at("ref_log_probs");
    for (const char* est : {"kl", "abs", "mse", "low_var_kl"})
      EXPECT_LT(test::max_abs_diff(kl_estimate(lp, ref, parse_kl_estimator(est)), verl(std::string("kl/") + est)), kTol)
          << est;
  }

  void KlPenaltyInReward() {
    const auto& mask = batch_.t.at("response_mask");
    auto ours = apply_kl_penalty(batch_.t.at("token_level_rewards"), batch_.t.at("old_log_probs"),
                                 batch_.t.at("ref_log_probs"), mask, 0.05, KlEstimator::K1);
    // verl's compute_rewards does not mask; compare on response tokens.
    EXPECT_LT(test::max_abs_diff(ours * mask, verl("rewards_kl") * mask), kTol);
  }

  void MicroBatchAggregationWithGlobalNormaliser() {
    const auto& mask = batch_.t.at("response_mask");
    auto mat = batch_.t.at("loss_mat");
    for (const char* mode : kModes) {
      auto m = parse_loss_agg_mode(mode);
      double n = loss_normaliser(mask, m);
      auto part = agg_loss(mat.slice(0, 0, batch_.split), mask.slice(0, 0, batch_.split), m, n, batch_.scale);
      EXPECT_NEAR(part.item<double>(), verl(std::string("micro/") + mode + "/loss").item<double>(), kTol) << mode;
    }
  }

  Batch batch_;
  std::map<std::string, at::Tensor> verl_;
};

// One test per batch: the oracle (importing verl takes seconds) runs once per process.
TEST_P(VerlParity, AgreesWithVerl) {
  {
    SCOPED_TRACE("AdvantageEstimators");
    AdvantageEstimators();
  }
  {
    SCOPED_TRACE("PpoClipLossGradientAndMetricsInEveryAggMode");
    PpoClipLossGradientAndMetricsInEveryAggMode();
  }
  {
    SCOPED_TRACE("RpgClipWithoutKlMatchesPpo");
    RpgClipWithoutKlMatchesPpo();
  }
  {
    SCOPED_TRACE("GspoAndCispo");
    GspoAndCispo();
  }
  {
    SCOPED_TRACE("KlEstimators");
    KlEstimators();
  }
  {
    SCOPED_TRACE("KlPenaltyInReward");
    KlPenaltyInReward();
  }
  {
    SCOPED_TRACE("MicroBatchAggregationWithGlobalNormaliser");
    MicroBatchAggregationWithGlobalNormaliser();
  }
}









INSTANTIATE_TEST_SUITE_P(RandomBatches, VerlParity, ::testing::Values(1u, 2u, 3u));

}  // namespace
}  // namespace rpg::algo
