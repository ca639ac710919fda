// The authors' fork as a live oracle (tests/oracles/algo_fork_parity.py loads the fork's own
// core_algos.py from RPG_FORK_DIR, provisioned by scripts/setup.sh): for every distinct
// actor-loss setting of the 60 run scripts (and extra settings reaching every kl_penalty form
// and loss_agg_mode), the loss and gradient of one mini-batch cut into several micro-batches,
// dynamic bsz on and off, equal dp_actor.update_policy assembled from the fork's functions.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "algo_test_util.h"
#include "rpg/algo/fork_loss.h"
#include "test_util.h"

namespace rpg::algo {
namespace {

constexpr double kTol = 1e-6;
constexpr int64_t kMicro = 3;  // ppo_micro_batch_size_per_gpu: 8 rows -> 3 + 3 + 2, accumulation 8 // 3 = 2

struct Setting {
  std::string origin;
  ForkLossConfig config;
};

std::map<std::string, at::Tensor> make_batch() {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(15);
  const int64_t B = 8, T = 7;
  auto lengths = at::tensor({7, 3, 5, 1, 7, 2, 6, 4}, at::kLong);
  auto mask = (at::arange(T, at::kLong).unsqueeze(0) < lengths.unsqueeze(1)).to(at::kDouble);
  auto lp = -at::rand({B, T}, gen, at::kDouble) * 2 - 0.05;
  auto old = lp - 0.6 * at::randn({B, T}, gen, at::kDouble);
  auto ref = lp - 0.8 * at::randn({B, T}, gen, at::kDouble);
  auto adv = at::randn({B, T}, gen, at::kDouble);
  // Row 0 visits every PPO region and both clamps of the RPG forms: log w = -1 (A < 0, lower
  // clip), 0, 0.4 (A > 0, upper clip), 2.5 (A < 0: dual clip at c = 3, not at c = 10),
  // 3 (w log w = 60 -> clamp 10), -3.5, 1.2.
  using at::indexing::Slice;
  auto lw = at::tensor({-1.0, 0.0, 0.4, 2.5, 3.0, -3.5, 1.2}, at::kDouble);
  old.index_put_({0, Slice()}, lp.index({0, Slice()}) - lw);
  ref.index_put_({4, Slice()}, lp.index({4, Slice()}) - lw.flip(0));
  adv.index_put_({0, Slice()}, at::tensor({-1.0, 1.0, 1.0, -1.0, 0.5, -0.3, 2.0}, at::kDouble));
  return {{"log_probs", lp},          {"old_log_probs", old},
          {"ref_log_probs", ref},     {"advantages", adv},
          {"response_mask", mask},    {"dyn_partition", at::tensor({0, 1, 1, 2, 0, 2, 1, 2}, at::kDouble)},
          {"config", at::tensor({static_cast<double>(kMicro)}, at::kDouble)}};
}

std::vector<Setting> read_settings(const std::filesystem::path& path) {
  std::ifstream in(path);
  std::vector<Setting> out;
  for (std::string line; std::getline(in, line);) {
    std::istringstream is(line);
    int index = 0, use_kl = 0, iterative = 0;
    std::string agg;
    Setting s;
    auto& c = s.config;
    is >> index >> s.origin >> c.clip_ratio_low >> c.clip_ratio_high >> c.clip_ratio_c >> agg >> c.entropy_coeff >>
        use_kl >> c.kl_loss_coef >> c.kl_loss_type >> iterative;
    if (!is) throw std::runtime_error("bad settings line: " + line);
    c.loss_agg_mode = parse_loss_agg_mode(agg);
    c.use_kl_loss = use_kl != 0;
    c.use_iterative_ref_model = iterative != 0;
    if (index != static_cast<int>(out.size())) throw std::runtime_error("settings out of order");
    out.push_back(s);
  }
  return out;
}

TEST(ForkParity, EveryScriptSettingMatchesTheForksActorUpdate) {
  const std::filesystem::path fork_dir = RPG_FORK_DIR;
  ASSERT_TRUE(std::filesystem::exists(fork_dir / "verl/trainer/ppo/core_algos.py"))
      << "the authors' fork is missing at " << fork_dir << " (run scripts/setup.sh)";
  auto batch = make_batch();
  rpg::test::TempDir dir;
  test::write_tensors(dir / "in.txt", batch);
  rpg::test::run_oracle("algo_fork_parity.py", {fork_dir.string(), (dir / "in.txt").string(),
                                                (dir / "out.txt").string(), (dir / "settings.txt").string()});
  auto fork = test::read_tensors(dir / "out.txt");
  auto settings = read_settings(dir / "settings.txt");
  // 17 distinct actor-loss settings in the 60 scripts, 14 extra.
  ASSERT_EQ(std::count_if(settings.begin(), settings.end(), [](auto& s) { return s.origin != "extra"; }), 17);
  ASSERT_EQ(settings.size(), 31u);

  const int64_t rows = batch["log_probs"].size(0);
  std::vector<std::vector<int64_t>> dyn(3);
  for (int64_t i = 0; i < rows; ++i) dyn[static_cast<size_t>(batch["dyn_partition"][i].item<double>())].push_back(i);
  for (size_t i = 0; i < settings.size(); ++i) {
    const auto& s = settings[i];
    for (int d : {0, 1}) {
      SCOPED_TRACE(s.origin + " kl_loss_type=" + s.config.kl_loss_type + " dynamic_bsz=" + std::to_string(d));
      auto theta = batch["log_probs"].clone().requires_grad_(true);
      PolicyLossInputs in;
      in.log_probs = theta * 1.0;
      in.old_log_probs = batch["old_log_probs"];
      in.ref_log_probs = batch["ref_log_probs"];
      in.advantages = batch["advantages"];
      in.response_mask = batch["response_mask"];
      in.entropy = -at::exp(in.log_probs) * in.log_probs;
      auto parts = d ? dyn : fork_fixed_micro_batches(rows, kMicro);
      auto loss = fork_mini_batch_loss(in, s.config, parts, d != 0, rows, kMicro);
      auto grad = test::grad_of(loss, theta);
      const std::string key = "s" + std::to_string(i) + "/d" + std::to_string(d) + "/";
      EXPECT_NEAR(loss.item<double>(), fork.at(key + "loss").item<double>(), kTol);
      EXPECT_LT(test::max_abs_diff(grad, fork.at(key + "grad")), kTol);
      const auto& ref = s.config.use_iterative_ref_model ? in.old_log_probs : in.ref_log_probs;
      EXPECT_LT(test::max_abs_diff(fork_kl_penalty(batch["log_probs"], ref, s.config.kl_loss_type),
                                   fork.at(key + "kl")),
                kTol);
    }
  }
}

TEST(ForkLoss, MicroBatchWeightIsTheForks) {
  EXPECT_DOUBLE_EQ(fork_micro_batch_weight(3, 8, true, 0), 3.0 / 8.0);
  EXPECT_DOUBLE_EQ(fork_micro_batch_weight(2, 8, false, 3), 0.5);  // 1 / (8 // 3), whatever the rows
  EXPECT_THROW(fork_micro_batch_weight(2, 2, false, 3), ValueError);
  EXPECT_THROW(fork_kl_penalty(at::zeros({1, 1}), at::zeros({1, 1}), "full"), ValueError);
  ForkLossConfig c;
  c.loss_agg_mode = LossAggMode::SeqMeanTokenSumNorm;
  EXPECT_THROW(validate(c), ValueError);
}

}  // namespace
}  // namespace rpg::algo
