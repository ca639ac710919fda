// Per-form pins against tests/oracles/paper_formulas.py, an independent Python transcription
// of the paper's Table 1 (UFKL, URKL), Table 4 (FKL, RKL), Table 2 / Appendix F
// (REINFORCE-style weights) and Algorithms 1-2 (dual clip, beta > 0), written from the
// paper's text. Unlike the softmax enumeration tests (exact_gradient_test.cpp), these inputs
// give every form a different gradient, so exchanging two forms (URKL <-> RKL, FKL <-> UFKL)
// or their C_KL fails here.
#include <gtest/gtest.h>

#include "algo_test_util.h"
#include "rpg/algo/policy_loss.h"
#include "test_util.h"

namespace rpg::algo {
namespace {

constexpr double kTol = 1e-9;
constexpr double kBeta = 0.3, kZ = 1.7, kEps1 = 0.2, kEps2 = 0.28, kC = 3.0;

struct Inputs {
  at::Tensor log_probs, old_log_probs, advantages;
};

// One row of N samples; log w spans every clip region: below 1 - eps1, the band, above
// 1 + eps2, above c; advantages of both signs and sizes comparable to beta.
Inputs fixed_inputs() {
  auto lp = at::tensor({-0.7, -1.9, -0.4, -2.6, -1.2, -0.9, -3.1, -0.25, -1.6, -0.6, -2.2, -1.4}, at::kDouble);
  auto lw = at::tensor({-1.5, -0.4, -0.1, 0.0, 0.12, 0.3, 0.6, 1.2, 1.6, -2.5, 0.05, 2.3}, at::kDouble);
  auto adv = at::tensor({-2.0, 0.5, 0.05, -0.2, 1.1, 0.7, -0.6, -1.0, 0.4, -0.05, -0.02, -1.3}, at::kDouble);
  return {lp.unsqueeze(0), (lp - lw).unsqueeze(0), adv.unsqueeze(0)};
}

std::map<std::string, at::Tensor> paper(const Inputs& x) {
  rpg::test::TempDir dir;
  test::write_tensors(dir / "in.txt", {{"log_probs", x.log_probs},
                                       {"old_log_probs", x.old_log_probs},
                                       {"advantages", x.advantages},
                                       {"config", at::tensor({kBeta, kZ, kEps1, kEps2, kC}, at::kDouble)}});
  rpg::test::run_oracle("paper_formulas.py", {(dir / "in.txt").string(), (dir / "out.txt").string()});
  return test::read_tensors(dir / "out.txt");
}

struct Result {
  double loss;
  at::Tensor grad;
};

Result ours(const Inputs& x, const char* loss, Divergence kl, bool clip) {
  auto theta = x.log_probs.clone().requires_grad_(true);
  PolicyLossInputs in;
  in.log_probs = theta * 1.0;
  in.old_log_probs = x.old_log_probs;
  in.advantages = x.advantages;
  in.response_mask = at::ones_like(x.log_probs);
  in.normaliser = static_cast<double>(x.log_probs.numel());  // token-mean = (1/N) sum_i
  PolicyLossConfig c;
  c.kl = kl;
  c.kl_coef = kBeta;
  c.clip = clip;
  c.clip_ratio_low = kEps1;
  c.clip_ratio_high = kEps2;
  c.clip_ratio_c = kC;
  c.old_mass = (clip || !is_unnormalized(kl)) ? 1.0 : kZ;
  auto out = compute_policy_loss(loss, in, c).loss;
  return {out.item<double>(), test::grad_of(out, theta)};
}

const Divergence kForms[] = {Divergence::FKL, Divergence::RKL, Divergence::UFKL, Divergence::URKL};

class PaperForms : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { p_ = new std::map<std::string, at::Tensor>(paper(fixed_inputs())); }
  static void TearDownTestSuite() { delete p_; }
  static const at::Tensor& p(const std::string& key) { return p_->at(key); }
  static std::map<std::string, at::Tensor>* p_;
};
std::map<std::string, at::Tensor>* PaperForms::p_ = nullptr;

// The pins can tell the forms apart: on these inputs every pair has a different gradient.
TEST_F(PaperForms, FormsAreDistinguishable) {
  for (const char* kind : {"table", "rf", "alg1", "alg2"})
    for (auto a : kForms)
      for (auto b : kForms)
        if (a != b) {
          EXPECT_GT(test::max_abs_diff(p(str(kind, "/", to_string(a), "/grad")), p(str(kind, "/", to_string(b), "/grad"))),
                    1e-3)
              << kind << " " << to_string(a) << " vs " << to_string(b);
        }
}

// Tables 1 and 4, no clip. rpg's values differ from the printed rows by a constant that the
// gradient never sees, chosen so the expected loss is -J (docs/algorithms.md): URKL adds
// beta*Z (the mass term of UKL that Remark 3.7 omits); FKL writes -beta log w for
// -beta log pi_theta, i.e. adds beta * log pi_old.
TEST_F(PaperForms, DifferentiableSurrogatesMatchTables1And4) {
  auto x = fixed_inputs();
  for (auto kl : kForms) {
    SCOPED_TRACE(to_string(kl));
    auto r = ours(x, "rpg", kl, /*clip=*/false);
    double shift = 0;
    if (kl == Divergence::URKL) shift = kBeta * kZ;
    if (kl == Divergence::FKL) shift = kBeta * x.old_log_probs.mean().item<double>();
    EXPECT_NEAR(r.loss, p("table/" + to_string(kl) + "/loss").item<double>() + shift, kTol);
    EXPECT_LT(test::max_abs_diff(r.grad, p("table/" + to_string(kl) + "/grad")), kTol);
  }
}

TEST_F(PaperForms, ReinforceStyleMatchesTable2AndAppendixF) {
  auto x = fixed_inputs();
  for (auto kl : kForms) {
    SCOPED_TRACE(to_string(kl));
    auto r = ours(x, "rpg_reinforce", kl, /*clip=*/false);
    EXPECT_NEAR(r.loss, p("rf/" + to_string(kl) + "/loss").item<double>(), kTol);
    EXPECT_LT(test::max_abs_diff(r.grad, p("rf/" + to_string(kl) + "/grad")), kTol);
  }
}

TEST_F(PaperForms, RpgStyleClipMatchesAlgorithm1) {
  auto x = fixed_inputs();
  for (auto kl : kForms) {
    SCOPED_TRACE(to_string(kl));
    auto r = ours(x, "rpg", kl, /*clip=*/true);
    EXPECT_NEAR(r.loss, p("alg1/" + to_string(kl) + "/loss").item<double>(), kTol);
    EXPECT_LT(test::max_abs_diff(r.grad, p("alg1/" + to_string(kl) + "/grad")), kTol);
  }
}

TEST_F(PaperForms, RpgReinforceClipMatchesAlgorithm2InEveryRegion) {
  auto x = fixed_inputs();
  for (auto kl : kForms) {
    SCOPED_TRACE(to_string(kl));
    // The inputs reach all five branches of lines 16-35 for every form.
    auto regions = p("alg2/" + to_string(kl) + "/regions");
    for (int region = 0; region < 5; ++region)
      EXPECT_TRUE((regions == region).any().item<bool>()) << "branch " << region << " not visited";
    auto r = ours(x, "rpg_reinforce", kl, /*clip=*/true);
    EXPECT_NEAR(r.loss, p("alg2/" + to_string(kl) + "/loss").item<double>(), kTol);
    EXPECT_LT(test::max_abs_diff(r.grad, p("alg2/" + to_string(kl) + "/grad")), kTol);
  }
}

}  // namespace
}  // namespace rpg::algo
