// dist.shard_master_weights (docs/scaling.md, "fp32 master weights"): with ZeRO-1/2 and bf16
// compute the policy holds bf16 weights and the fp32 masters live only in the sharded
// optimizer state. `rpg train` over 2 ranks (rpg launch, Gloo on loopback) equals 1 rank
// with the same mode; each rank holds half of the masters and of the optimizer state; a
// 2-rank checkpoint resumes on 1 rank; the combinations the mode cannot run are refused; and
// `rpg plan` prints the layout's bytes. Same fixture and run shape as tests/dist/train_dp_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "rpg/core/io.h"
#include "rpg/dist/plan.h"
#include "run_files.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace rpg::train {
namespace {

using test::run_process;

using Tensors = test::SafetensorsValues;
Tensors read_tensors(const fs::path& file) { return test::read_safetensors_values(file); }
// Each step's metrics; `perf`: the perf/memory/* byte counts, else what two runs must agree on.
std::vector<std::map<std::string, double>> read_metrics(const fs::path& file, bool perf) {
  return test::read_step_metrics(file, perf ? test::StepMetrics::kMemory : test::StepMetrics::kCompared);
}

// Every tensor of `got` equals `want`'s within 1e-6 of the tensor's largest magnitude (the
// bf16 ZeRO tests' tolerance); returns how many names start with `prefix`.
size_t expect_close(const std::map<std::string, std::vector<double>>& want,
                    const std::map<std::string, std::vector<double>>& got, const std::string& what,
                    const std::string& prefix = "") {
  EXPECT_EQ(got.size(), want.size()) << what;
  size_t counted = 0;
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    if (it == got.end()) {
      ADD_FAILURE() << name << " missing from " << what;
      continue;
    }
    if (!prefix.empty() && name.rfind(prefix, 0) == 0) ++counted;
    if (it->second.size() != w.size()) {
      ADD_FAILURE() << name << ": " << it->second.size() << " values, expected " << w.size();
      continue;
    }
    double scale = 0, diff = 0;
    for (size_t i = 0; i < w.size(); ++i) scale = std::max(scale, std::abs(w[i])), diff = std::max(diff, std::abs(w[i] - it->second[i]));
    EXPECT_LE(diff, 1e-6 * scale) << what << ": " << name;
  }
  return counted;
}

class ShardMasterWeights : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    fixture_ = test::oracle_output_dir("tiny_chat_model.py");
    dir_ = new test::TempDir();
    data_ = test::prepare_prompts(dir_->path());
  }
  static void TearDownTestSuite() { delete dir_; }

  // tests/dist/train_dp_test.cpp's run: 4 prompts x 2 responses per step, 2 mini-batches of 4
  // rows, micro-batches of 2 rows (one per rank of 2), KL loss to the iterative reference
  // refreshed every step, lr 1e-2, 3 steps, a checkpoint every step; bf16 compute with the
  // master weights sharded at ZeRO `stage`. `launch`: rpg launch's arguments (none: 1 process).
  static std::vector<std::string> argv(const std::vector<std::string>& launch, const fs::path& run, int stage,
                                       const std::vector<std::string>& more = {}) {
    std::vector<std::string> mode = {"actor_rollout_ref.actor.compute_dtype=bfloat16", "dist.shard_master_weights=true",
                                     "dist.zero_stage=" + std::to_string(stage)};
    mode.insert(mode.end(), more.begin(), more.end());
    return test::dp_train_argv(fixture_, data_, launch, run, 3, mode);
  }

  // Runs `a` into `run` unless an earlier test of this process already did.
  static void ensure_run(const fs::path& run, const std::vector<std::string>& a, bool one_process) {
    if (fs::exists(run / "global_step_3" / "train_state.json")) return;
    auto r = run_process(a, one_process ? std::vector<std::string>{"OMP_NUM_THREADS=1"} : std::vector<std::string>{});
    if (r.exit_code != 0) throw std::runtime_error("run failed (exit " + std::to_string(r.exit_code) + "): " + r.err);
  }
  // The 1-process run of the mode (ZeRO stage 1; alone a process's optimizer is whole, so the
  // stage does not change it: it is the reference of both stages).
  static fs::path one() {
    const fs::path run = *dir_ / "one";
    ensure_run(run, argv({}, run, 1), true);
    return run;
  }
  static fs::path two(int stage) {
    const fs::path run = *dir_ / ("two_zero" + std::to_string(stage));
    ensure_run(run, argv({"--nproc", "2"}, run, stage), false);
    return run;
  }

  // Samples identical, every metric of every step within 1e-6, the final bf16 weights as
  // expect_close_bf16 (the fp32 masters within 1e-6: expect_two_ranks_equal_one).
  static void expect_equal_runs(const fs::path& want, const fs::path& got) {
    EXPECT_TRUE(read_file(want / "samples.jsonl") == read_file(got / "samples.jsonl"))
        << "samples.jsonl differs: " << want << " vs " << got;
    const auto wm = read_metrics(want / "metrics.jsonl", false), gm = read_metrics(got / "metrics.jsonl", false);
    ASSERT_EQ(wm.size(), 3u);
    ASSERT_EQ(gm.size(), wm.size());
    for (size_t s = 0; s < wm.size(); ++s) {
      ASSERT_EQ(gm[s].size(), wm[s].size()) << "step " << s + 1;
      for (const auto& [k, v] : wm[s]) {
        ASSERT_TRUE(gm[s].count(k)) << k;
        EXPECT_NEAR(gm[s].at(k), v, 1e-6 * std::max(1.0, std::abs(v))) << "step " << s + 1 << " " << k;
      }
    }
    const std::string model = "global_step_3/actor/model.safetensors";
    const Tensors w = read_tensors(want / model), g = read_tensors(got / model);
    for (const auto& [name, dtype] : g.dtypes) EXPECT_EQ(dtype, "BF16") << name << ": the policy's weights are bf16";
    expect_close_bf16(w.values, g.values, (got / model).string());
  }

  // bf16 weights rounded from fp32 masters that agree within 1e-6 (checked on the optimizer
  // state) may round to neighbouring bf16 values: each element within one bf16 ulp of the
  // larger of the two (2^-7 relative), and at most 1 % of the elements differ at all.
  static void expect_close_bf16(const std::map<std::string, std::vector<double>>& want,
                                const std::map<std::string, std::vector<double>>& got, const std::string& what) {
    EXPECT_EQ(got.size(), want.size()) << what;
    size_t elements = 0, differ = 0;
    for (const auto& [name, w] : want) {
      auto it = got.find(name);
      if (it == got.end() || it->second.size() != w.size()) {
        ADD_FAILURE() << name << " missing or mis-sized in " << what;
        continue;
      }
      for (size_t i = 0; i < w.size(); ++i) {
        const double a = w[i], b = it->second[i];
        ++elements;
        if (a == b) continue;
        ++differ;
        EXPECT_LE(std::abs(a - b), std::ldexp(std::max(std::abs(a), std::abs(b)), -7)) << what << ": " << name << "[" << i << "]";
      }
    }
    EXPECT_LE(differ * 100, elements) << what << ": " << differ << " of " << elements << " bf16 weights differ";
  }

  // The policy's bf16 weights are its fp32 masters rounded to nearest-even (the optimizer
  // publishes them): actor/ of a checkpoint against its optimizer state ("optim.<p>.master").
  static void expect_weights_are_rounded_masters(const fs::path& ckpt, int world) {
    const auto weights = read_tensors(ckpt / "actor/model.safetensors").values;
    const auto state = optimizer_state(ckpt, world);
    for (const auto& [name, w] : weights) {
      auto it = state.find("optim." + name + ".master");
      if (it == state.end()) {
        ADD_FAILURE() << "no master for " << name << " in " << ckpt;
        continue;
      }
      ASSERT_EQ(it->second.size(), w.size()) << name;
      size_t wrong = 0;
      for (size_t i = 0; i < w.size(); ++i) {
        const float m = static_cast<float>(it->second[i]);
        uint32_t bits;
        std::memcpy(&bits, &m, 4);
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000u;  // round to nearest even
        float r;
        std::memcpy(&r, &bits, 4);
        wrong += static_cast<double>(r) != w[i];
      }
      EXPECT_EQ(wrong, 0u) << name << " in " << ckpt << ": bf16 weights that are not the rounded masters";
    }
  }

  // The optimizer state of a checkpoint, "optim.<param>.<slot>" flattened: a one-process
  // checkpoint's from train_state.safetensors, a sharded one's from its `world` shard files
  // (in rank order, as the manifest lists them).
  static std::map<std::string, std::vector<double>> optimizer_state(const fs::path& ckpt, int world) {
    std::map<std::string, std::vector<double>> out;
    if (world == 1) {
      for (auto& [name, v] : read_tensors(ckpt / "train_state.safetensors").values)
        if (name.rfind("optim.", 0) == 0) out[name] = std::move(v);
      return out;
    }
    const auto manifest = nlohmann::json::parse(read_file(ckpt / "train_state.json")).at("optimizer_shards");
    EXPECT_EQ(manifest.at("world_size").get<int>(), world);
    for (const auto& s : manifest.at("shards"))
      for (auto& [name, v] : read_tensors(ckpt / s.at("file").get<std::string>()).values) {
        auto& all = out["optim." + name];
        all.insert(all.end(), v.begin(), v.end());
      }
    return out;
  }

  // 2 ranks at `stage` equal 1 rank: the run, and the optimizer state incl. every parameter's
  // fp32 master.
  static void expect_two_ranks_equal_one(int stage) {
    const fs::path a = one(), b = two(stage);
    expect_equal_runs(a, b);
    const auto want = optimizer_state(a / "global_step_3", 1), got = optimizer_state(b / "global_step_3", 2);
    size_t masters = 0;
    for (const auto& [name, v] : want) masters += name.size() > 7 && name.compare(name.size() - 7, 7, ".master") == 0;
    EXPECT_GT(masters, 0u) << "no fp32 master in the optimizer state";
    EXPECT_GT(expect_close(want, got, "the optimizer shards", "optim."), 0u);
    expect_weights_are_rounded_masters(a / "global_step_3", 1);
    expect_weights_are_rounded_masters(b / "global_step_3", 2);
  }

  // Runs `one_name` (1 process) and `two_name` (2 ZeRO-1 ranks) with the `more` overrides
  // unless done, and checks they are equal (the run, and the optimizer state against the
  // shards); returns the 2-rank run.
  static fs::path expect_zero_one_equals_one_process(const std::string& one_name, const std::string& two_name,
                                                     const std::vector<std::string>& more, const std::string& what) {
    const fs::path a = *dir_ / one_name, b = *dir_ / two_name;
    ensure_run(a, argv({}, a, 1, more), true);
    ensure_run(b, argv({"--nproc", "2"}, b, 1, more), false);
    expect_equal_runs(a, b);
    EXPECT_GT(expect_close(optimizer_state(a / "global_step_3", 1), optimizer_state(b / "global_step_3", 2), what,
                           "optim."),
              0u);
    return b;
  }

  static fs::path fixture_;
  static std::string data_;
  static test::TempDir* dir_;
};
fs::path ShardMasterWeights::fixture_;
std::string ShardMasterWeights::data_;
test::TempDir* ShardMasterWeights::dir_ = nullptr;

TEST_F(ShardMasterWeights, ZeroOneTwoRanksEqualOneRank) { expect_two_ranks_equal_one(1); }
TEST_F(ShardMasterWeights, ZeroTwoTwoRanksEqualOneRank) { expect_two_ranks_equal_one(2); }

// The fp32 masters start from the checkpoint's fp32 weights, not from their bf16 rounding:
// with lr 1e-30 (0 is refused) a step moves a weight by at most ~1e-30, far below an fp32 ulp
// of any non-zero weight (and a zero one to at most ~1e-30), so after it every master equals
// the fixture's model.safetensors (F32) within 1e-20 -- a bf16 rounding would be off by ~1e-3
// relative -- on 1 rank (whole, in train_state.safetensors) and on 2 ZeRO-2 ranks (the halves
// in the shards), and the bf16 weights are their rounding.
TEST_F(ShardMasterWeights, MastersStartAtTheCheckpointsFp32Weights) {
  const Tensors model = read_tensors(fixture_ / "model" / "model.safetensors");
  for (const auto& [name, dtype] : model.dtypes) ASSERT_EQ(dtype, "F32") << name << ": the fixture must be fp32";
  for (int world : {1, 2}) {
    const fs::path run = *dir_ / ("lr0_" + std::to_string(world));
    auto a = argv(world == 1 ? std::vector<std::string>{} : std::vector<std::string>{"--nproc", "2"}, run, 2,
                  {"actor_rollout_ref.actor.optim.lr=1e-30", "trainer.total_training_steps=1"});
    auto r = run_process(a, {"OMP_NUM_THREADS=1"});
    ASSERT_EQ(r.exit_code, 0) << r.err;
    const auto state = optimizer_state(run / "global_step_1", world);
    size_t checked = 0;
    for (const auto& [name, w] : model.values) {
      auto it = state.find("optim." + name + ".master");
      if (it == state.end()) continue;  // a tensor that is no parameter (none in the fixture)
      ++checked;
      ASSERT_EQ(it->second.size(), w.size()) << name;
      double diff = 0;
      for (size_t i = 0; i < w.size(); ++i) diff = std::max(diff, std::abs(it->second[i] - w[i]));
      EXPECT_LE(diff, 1e-20) << name << " (" << world << " rank(s)): the master is not the fp32 weight";
    }
    EXPECT_EQ(checked, model.values.size());
    expect_weights_are_rounded_masters(run / "global_step_1", world);
  }
}

// Gradient accumulation over micro-batches: 1-row micro-batches, 4 per mini-batch, 2 per rank,
// accumulated in fp32 (1 rank and ZeRO-1: the fp32 accumulators the bf16 gradients are added
// into after each backward; ZeRO-2: the fp32 buckets and shard, 4 KiB buckets so that most
// parameters are reduced on their own during backward). The fp32 sums of the four bf16
// gradients are exact in any order (as in tests/dist's ZeroTwoSeveralMicroBatchesEqualOneRank),
// so both stages equal 1 rank.
TEST_F(ShardMasterWeights, SeveralMicroBatchesPerRankEqualOneRank) {
  const std::string micro = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1";
  const fs::path one = *dir_ / "micro_one";
  ensure_run(one, argv({}, one, 1, {micro}), true);
  for (int stage : {1, 2}) {
    const fs::path two = *dir_ / ("micro_two_zero" + std::to_string(stage));
    ensure_run(two, argv({"--nproc", "2"}, two, stage, {micro, "dist.reduce_bucket_mb=0.004"}), false);
    expect_equal_runs(one, two);
    EXPECT_GT(expect_close(optimizer_state(one / "global_step_3", 1), optimizer_state(two / "global_step_3", 2),
                           "ZeRO-" + std::to_string(stage) + " shards", "optim."),
              0u);
  }
}

// Schedule-free AdamW (its master y and base sequence z both start at the fp32 weights; its
// evaluation/training switches re-gather the bf16 weights): 2 ZeRO-1 ranks equal 1 rank.
TEST_F(ShardMasterWeights, ScheduleFreeZeroOneTwoRanksEqualOneRank) {
  const std::vector<std::string> sf = {"actor_rollout_ref.actor.optim.optim_type=schedule_free_adamw",
                                       "actor_rollout_ref.actor.optim.lr_warmup_steps=2"};
  expect_zero_one_equals_one_process("sf_one", "sf_two", sf, "the schedule-free shards");
}

// Fork semantics (the authors' update loop: transformers' parameter order, the fork's loss and
// constant schedule) with the iterative reference (ref = old log-probs, no resident model) and
// with the fixed one (the initial policy, resident in bf16): 2 ZeRO-1 ranks equal 1 rank.
TEST_F(ShardMasterWeights, ForkSemanticsZeroOneTwoRanksEqualOneRank) {
  for (const std::string iterative : {"true", "false"}) {
    SCOPED_TRACE("use_iterative_ref_model=" + iterative);
    const std::vector<std::string> fork = {"rpg.semantics=fork", "actor_rollout_ref.actor.policy_loss=vanilla",
                                           "algorithm.adv_estimator=grpo",
                                           "actor_rollout_ref.actor.use_iterative_ref_model=" + iterative};
    const fs::path two = expect_zero_one_equals_one_process("fork_one_" + iterative, "fork_two_" + iterative, fork,
                                                            "the fork run's shards");
    expect_weights_are_rounded_masters(two / "global_step_3", 2);
  }
}

// The accounted bytes (perf/memory/*, dist/memory.h): the weights are bf16 (2 B/param, on
// every rank); the fp32 masters (4 B/param) and the moments (8 B/param) are whole on 1 rank
// and split into two halves (to one element) by 2 ranks, at ZeRO-1 and ZeRO-2.
TEST_F(ShardMasterWeights, MastersAndOptimizerStateAreHalvedPerRank) {
  const auto alone = read_metrics(one() / "metrics.jsonl", true).back();
  const double weights = alone.at("weight_bytes"), masters = alone.at("master_bytes");
  const double params = weights / 2;  // bf16
  EXPECT_EQ(masters, 4 * params);
  EXPECT_EQ(alone.at("optimizer_state_bytes"), 8 * params);
  EXPECT_EQ(alone.at("grad_bytes_max"), 4 * params);  // the fp32 gradient accumulators
  for (int stage : {1, 2}) {
    const fs::path run = two(stage);
    double sum_masters = 0, sum_state = 0;
    for (const fs::path& file : {run / "metrics.jsonl", run / "rank_1" / "metrics.jsonl"}) {
      const auto m = read_metrics(file, true).back();
      EXPECT_EQ(m.at("weight_bytes"), weights) << file;  // bf16, replicated
      EXPECT_NEAR(m.at("master_bytes"), masters / 2, 4) << file;
      EXPECT_NEAR(m.at("optimizer_state_bytes"), 8 * params / 2, 8) << file;
      if (stage == 2) {  // the fp32 gradient shard (half) + at most two buckets and one (bf16) gradient
        EXPECT_NEAR(m.at("grad_shard_bytes"), 4 * params / 2, 4) << file;
        EXPECT_LE(m.at("grad_bytes_max"), m.at("grad_shard_bytes") + 2 * m.at("grad_bucket_bytes") + m.at("largest_param_bytes"))
            << file;
      }
      sum_masters += m.at("master_bytes"), sum_state += m.at("optimizer_state_bytes");
    }
    EXPECT_EQ(sum_masters, masters) << "ZeRO-" << stage;
    EXPECT_EQ(sum_state, 8 * params) << "ZeRO-" << stage;
  }
}

// A 2-rank ZeRO-2 checkpoint of step 1 resumed by 1 process: the fp32 masters come back from
// the 2 optimizer shards (not from the bf16 weights), and the continued run equals the
// uninterrupted 1-process one.
TEST_F(ShardMasterWeights, TwoRankCheckpointResumesOnOneRank) {
  const fs::path src = two(2), run = *dir_ / "resumed";
  fs::remove_all(run);
  fs::copy(src, run, fs::copy_options::recursive);
  for (int step = 2; step <= 3; ++step) fs::remove_all(run / ("global_step_" + std::to_string(step)));
  fs::remove_all(run / "rank_1");
  write_file_atomic(run / "latest_checkpointed_iteration.txt", "1");
  auto r = run_process(argv({}, run, 2), {"OMP_NUM_THREADS=1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_TRUE(r.err.find("resumed from") != std::string::npos) << r.err;
  expect_equal_runs(one(), run);
  EXPECT_GT(expect_close(optimizer_state(one() / "global_step_3", 1), optimizer_state(run / "global_step_3", 1),
                         "the resumed optimizer", "optim."),
            0u);
}

// And the other way: a 1-process checkpoint of step 1 (whole masters in train_state.safetensors)
// resumed by 2 ZeRO-1 ranks, each keeping its half of the masters: equals the uninterrupted run.
TEST_F(ShardMasterWeights, OneRankCheckpointResumesOnTwoZeroOneRanks) {
  const fs::path src = one(), run = *dir_ / "grown";
  fs::remove_all(run);
  fs::copy(src, run, fs::copy_options::recursive);
  for (int step = 2; step <= 3; ++step) fs::remove_all(run / ("global_step_" + std::to_string(step)));
  write_file_atomic(run / "latest_checkpointed_iteration.txt", "1");
  auto r = run_process(argv({"--nproc", "2"}, run, 1));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  expect_equal_runs(src, run);
  EXPECT_GT(expect_close(optimizer_state(src / "global_step_3", 1), optimizer_state(run / "global_step_3", 2),
                         "the grown run's optimizer shards", "optim."),
            0u);
}

// The combinations the mode cannot run: one `rpg: error:` line naming the key, before any
// model is loaded.
TEST_F(ShardMasterWeights, BadCombinationsAreRefused) {
  const fs::path run = *dir_ / "refused";
  struct Case {
    std::vector<std::string> overrides;
    std::string message;
  };
  const std::vector<Case> cases = {
      {{"actor_rollout_ref.actor.compute_dtype=float32"},
       "rpg: error: dist.shard_master_weights: true needs actor_rollout_ref.actor.compute_dtype=bfloat16 (got float32)"},
      {{"dist.zero_stage=0"}, "rpg: error: dist.shard_master_weights: true needs dist.zero_stage=1 or 2 (got 0)"}};
  for (const Case& c : cases) {
    auto r = run_process(argv({}, run, 1, c.overrides), {"OMP_NUM_THREADS=1"});
    EXPECT_NE(r.exit_code, 0) << c.message;
    EXPECT_TRUE(r.err.find(c.message) != std::string::npos) << r.err;
    EXPECT_FALSE(fs::exists(run / "global_step_1"));
  }
}

// A checkpoint of the default layout (fp32 weights, no masters in the optimizer state) is not
// resumed with the mode on: one line naming the setting (the resume fingerprint), not a
// silent restart from bf16-rounded weights.
TEST_F(ShardMasterWeights, DefaultLayoutCheckpointIsRefused) {
  const fs::path run = *dir_ / "default_layout";
  auto plain = argv({}, run, 1, {"trainer.total_training_steps=1", "dist.shard_master_weights=false"});
  auto a = run_process(plain, {"OMP_NUM_THREADS=1"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  auto b = run_process(argv({}, run, 1), {"OMP_NUM_THREADS=1"});
  EXPECT_NE(b.exit_code, 0);
  EXPECT_TRUE(b.err.find("rpg: error: cannot resume from ") != std::string::npos &&
              b.err.find("shard_master_weights was null, the config now says true") != std::string::npos)
      << b.err;
}

// And the other way: a checkpoint written with the mode on is not resumed with it off (its fp32
// masters are only in the optimizer shards; the saved weights are bf16).
TEST_F(ShardMasterWeights, ShardedLayoutCheckpointIsRefusedWithTheModeOff) {
  const fs::path run = *dir_ / "sharded_layout";
  auto a = run_process(argv({}, run, 1, {"trainer.total_training_steps=1"}), {"OMP_NUM_THREADS=1"});
  ASSERT_EQ(a.exit_code, 0) << a.err;
  auto b = run_process(argv({}, run, 1, {"dist.shard_master_weights=false"}), {"OMP_NUM_THREADS=1"});
  EXPECT_NE(b.exit_code, 0);
  EXPECT_TRUE(b.err.find("rpg: error: cannot resume from ") != std::string::npos &&
              b.err.find("shard_master_weights was true, the config now says false") != std::string::npos)
      << b.err;
  EXPECT_FALSE(fs::exists(run / "global_step_2"));
}

// rpg plan's model of the mode, against the closed forms of docs/scaling.md's table (P
// parameters, N ranks): bf16 weights 2P, fp32 masters 4P/N, fp32 gradients 4P (ZeRO-1) or
// 4P/N + 2 buckets (ZeRO-2), moments 8P/N, no compute copy, a bf16 fixed reference 2P; the
// default layout is unchanged (fp32 weights 4P + a bf16 compute copy 2P). The fixed reference
// is in the compute dtype: 2P with bf16 compute in either layout, 4P with fp32.
TEST_F(ShardMasterWeights, PlanEstimatesTheLayout) {
  dist::PlanInput in;
  in.model.parameters = 1000000;
  in.model.hidden = 64, in.model.layers = 2, in.model.intermediate = 128, in.model.heads = 4, in.model.kv_heads = 2;
  in.model.head_dim = 16, in.model.vocab = 1000;
  in.world = 8;
  in.bf16_compute = true;
  in.fixed_reference = true;
  in.bucket_bytes = 1024;
  const double P = 1e6, N = 8;
  for (int stage : {1, 2}) {
    in.zero_stage = stage;
    in.shard_master = false;
    const auto d = dist::estimate(in);
    EXPECT_EQ(d.weights, 4 * P);
    EXPECT_EQ(d.compute, 2 * P);
    EXPECT_EQ(d.master, 0);
    EXPECT_EQ(d.reference, 2 * P);
    in.bf16_compute = false;
    EXPECT_EQ(dist::estimate(in).reference, 4 * P);
    EXPECT_TRUE(dist::format_plan("m", in, dist::estimate(in)).find("fixed reference (fp32)") != std::string::npos);
    in.bf16_compute = true;
    EXPECT_TRUE(dist::format_plan("m", in, d).find("fixed reference (bf16)") != std::string::npos);
    in.shard_master = true;
    const auto p = dist::estimate(in);
    EXPECT_EQ(p.weights, 2 * P);
    EXPECT_EQ(p.compute, 0);
    EXPECT_EQ(p.master, 4 * P / N);
    EXPECT_EQ(p.optimizer, 8 * P / N);
    EXPECT_EQ(p.grads, stage == 1 ? 4 * P : 4 * P / N + 2 * 4.0 * 1000 * 64);  // 2 buckets of the embedding (fp32)
    EXPECT_EQ(p.reference, 2 * P);
    EXPECT_EQ(p.states, p.weights + p.master + p.grads + p.optimizer + p.reference);
    EXPECT_EQ(d.states - p.states, (4 - 2) * P + 2 * P - 4 * P / N);
    const std::string text = dist::format_plan("m", in, p);
    EXPECT_TRUE(text.find("weights (bf16)") != std::string::npos) << text;
    EXPECT_TRUE(text.find("master weights (fp32)     0.5 MiB (1/N, in the optimizer state)") != std::string::npos) << text;
  }
}

}  // namespace
}  // namespace rpg::train
