// The rollout engine on tiny random models: greedy output equals transformers' generate()
// (live), returned log-probs equal a full forward recomputation, output is identical for
// any slot count, and bad requests are clear errors.
#include "rpg/rollout/engine.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "rpg/core/device.h"
#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/decode_attention.h"
#include "test_devices.h"
#include "test_util.h"

namespace fs = std::filesystem;

namespace rpg::rollout {
namespace {

const std::vector<std::string> kModels = {"qwen2_fp32", "qwen3_fp32", "llama3_fp32"};

// Builds the models and transformers' outputs once for the whole suite; every test runs on
// each test device (CPU always, CUDA when present: test_devices.h).
class EngineTest : public ::testing::TestWithParam<at::Device> {
 protected:
  static void SetUpTestSuite() {
    dir_ = test::oracle_output_dir("rollout_hf_generate.py");
    ref_ = new nlohmann::json(nlohmann::json::parse(read_file(dir_ / "generate.json")));
  }
  static void TearDownTestSuite() { delete ref_; }
  model::CausalLM load(const std::string& name) const {
    return model::CausalLM::from_pretrained(dir_ / name, {at::kFloat, GetParam()});
  }
  static std::vector<std::vector<int64_t>> prompts(const std::string& name) {
    return (*ref_)[name]["prompts"].get<std::vector<std::vector<int64_t>>>();
  }
  static fs::path dir_;
  static nlohmann::json* ref_;
};
fs::path EngineTest::dir_;
nlohmann::json* EngineTest::ref_ = nullptr;
INSTANTIATE_TEST_SUITE_P(Devices, EngineTest, ::testing::ValuesIn(test::rpg_test_devices()), test::DeviceParamName());

TEST_P(EngineTest, GreedyEqualsTransformersGenerate) {
  for (const auto& name : kModels) {
    model::CausalLM m = load(name);
    auto expected = (*ref_)[name]["greedy"].get<std::vector<std::vector<int64_t>>>();
    for (int64_t slots : {1, 2, 8}) {
      RolloutEngine engine(m, {slots, 0});
      SamplingParams p;
      p.temperature = 0;
      p.max_new_tokens = 10;
      auto out = engine.generate(prompts(name), p);
      ASSERT_EQ(out.size(), expected.size());
      for (size_t i = 0; i < out.size(); ++i) {
        EXPECT_EQ(out[i].token_ids, expected[i]) << name << " slots " << slots << " prompt " << i;
        EXPECT_EQ(out[i].finish_reason, FinishReason::kLength);
        EXPECT_EQ(out[i].prompt_index, static_cast<int64_t>(i));
      }
    }
  }
}

TEST_P(EngineTest, StopTokenEndsTheResponseAsInTransformers) {
  for (const auto& name : kModels) {
    model::CausalLM m = load(name);
    auto expected = (*ref_)[name]["greedy_eos"].get<std::vector<std::vector<int64_t>>>();
    const int64_t eos = (*ref_)[name]["eos"].get<int64_t>();
    RolloutEngine engine(m, {3, 0});
    SamplingParams p;
    p.temperature = 0;
    p.max_new_tokens = 10;
    p.stop_token_ids = {eos};
    auto out = engine.generate(prompts(name), p);
    for (size_t i = 0; i < out.size(); ++i) {
      EXPECT_EQ(out[i].token_ids, expected[i]) << name << " prompt " << i;
      bool stopped = !out[i].token_ids.empty() && out[i].token_ids.back() == eos;
      EXPECT_EQ(out[i].finish_reason, stopped ? FinishReason::kStop : FinishReason::kLength);
    }
    EXPECT_EQ(out[0].finish_reason, FinishReason::kStop);
    // ignore_eos generates through it.
    p.ignore_eos = true;
    auto through = engine.generate(prompts(name), p);
    EXPECT_EQ(through[0].token_ids, (*ref_)[name]["greedy"][0].get<std::vector<int64_t>>());
  }
}

TEST_P(EngineTest, LogProbsEqualAFullForwardRecomputation) {
  model::CausalLM m = load("qwen3_fp32");
  RolloutEngine engine(m, {4, 0});
  SamplingParams p;
  p.temperature = 0.8;
  p.top_p = 0.9;
  p.top_k = 50;
  p.n = 3;
  p.max_new_tokens = 9;
  p.seed = 11;
  auto ps = prompts("qwen3_fp32");
  auto out = engine.generate(ps, p);
  ASSERT_EQ(out.size(), ps.size() * 3);
  for (const auto& r : out) {
    std::vector<int64_t> full = ps[static_cast<size_t>(r.prompt_index)];
    full.insert(full.end(), r.token_ids.begin(), r.token_ids.end());
    at::Tensor ids = at::tensor(full, at::kLong).unsqueeze(0);
    at::Tensor targets = at::tensor(r.token_ids, at::kLong).unsqueeze(0);
    model::LogProbOptions lo;
    lo.temperature = p.temperature;
    at::Tensor ref = m.log_probs(ids, {}, {}, targets, lo).log_probs[0].cpu();
    at::Tensor ours = at::tensor(std::vector<float>(r.log_probs.begin(), r.log_probs.end()));
    EXPECT_LT((ours - ref).abs().max().item<double>(), 1e-4) << "prompt " << r.prompt_index << " sample " << r.sample_index;
  }
}

TEST_P(EngineTest, OutputIsIdenticalForAnySlotCount) {
  model::CausalLM m = load("llama3_fp32");
  SamplingParams p;
  p.temperature = 1.0;
  p.n = 4;
  p.max_new_tokens = 12;
  p.seed = 5;
  p.stop_token_ids = {(*ref_)["llama3_fp32"]["eos"].get<int64_t>()};
  std::vector<std::vector<int64_t>> tokens_by_run;
  std::vector<Response> first;
  for (int64_t slots : {1, 3, 7, 64}) {
    RolloutEngine engine(m, {slots, 0});
    auto out = engine.generate(prompts("llama3_fp32"), p);
    if (first.empty()) {
      first = out;
      continue;
    }
    for (size_t i = 0; i < out.size(); ++i) EXPECT_EQ(out[i].token_ids, first[i].token_ids) << "slots " << slots << " seq " << i;
  }
  // Different samples of a prompt differ (their streams are independent), and a different
  // seed changes the output.
  EXPECT_NE(first[0].token_ids, first[1].token_ids);
  RolloutEngine engine(m, {8, 0});
  p.seed = 6;
  auto other = engine.generate(prompts("llama3_fp32"), p);
  EXPECT_NE(other[0].token_ids, first[0].token_ids);
}

// A prompt of `len` tokens: the 9-token oracle prompt repeated, each repeat shifted by one id.
std::vector<int64_t> prompt_of(const std::vector<int64_t>& base, size_t len) {
  std::vector<int64_t> p;
  for (size_t i = 0; i < len; ++i) p.push_back(base[i % base.size()] + static_cast<int64_t>(i / base.size()));
  return p;
}

SamplingParams sampling(double temperature, int64_t n, int64_t max_new_tokens, uint64_t seed) {
  SamplingParams p;
  p.temperature = temperature;
  p.n = n;
  p.max_new_tokens = max_new_tokens;
  p.seed = seed;
  return p;
}

// The full forward's log-prob of a response's first token after its prompt (T = 1 for greedy).
double first_token_log_prob(const model::CausalLM& m, const std::vector<int64_t>& prompt, const Response& r,
                            double temperature) {
  std::vector<int64_t> ids = prompt;
  ids.push_back(r.token_ids[0]);
  model::LogProbOptions lo;
  lo.temperature = temperature == 0.0 ? 1.0 : temperature;
  return m.log_probs(at::tensor(ids, at::kLong).unsqueeze(0), {}, {},
                     at::tensor({r.token_ids[0]}, at::kLong).unsqueeze(0), lo).log_probs.cpu().item<double>();
}

// Prompts admitted together are prefilled together: shortest first, in right-padded batches
// whose padded size stays within 5/4 of their real tokens. The responses are those of one
// prefill per sequence (one slot), greedy and sampled, and the first token's log-prob is the
// full forward's.
TEST_P(EngineTest, PromptsAdmittedTogetherArePrefilledTogether) {
  model::CausalLM m = load("qwen2_fp32");
  const auto base = prompts("qwen2_fp32")[2];  // 9 tokens
  // Lengths 8, 30, 7, 31, 8 -> {7, 8, 8} (24 padded for 23 real) and {30, 31} (62 for 61):
  // 7 + 8 + 8 + 30 would pad to 120 for 53.
  const std::vector<std::vector<int64_t>> ps = {prompt_of(base, 8), prompt_of(base, 30), prompt_of(base, 7),
                                                prompt_of(base, 31), prompt_of(base, 8)};
  for (double temperature : {0.0, 1.0}) {
    const SamplingParams p = sampling(temperature, 2, 5, 3);
    RolloutEngine together(m, {64, 0}), alone(m, {1, 0});
    const auto a = together.generate(ps, p), b = alone.generate(ps, p);
    EXPECT_EQ(together.last_stats().prefill_forwards, 2);
    EXPECT_EQ(alone.last_stats().prefill_forwards, 10);  // one slot: every sequence its own prefill
    EXPECT_EQ(together.last_stats().prompt_tokens, 8 + 30 + 7 + 31 + 8);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_EQ(a[i].token_ids, b[i].token_ids) << "temperature " << temperature << " seq " << i;
      EXPECT_NEAR(a[i].log_probs[0], first_token_log_prob(m, ps[static_cast<size_t>(a[i].prompt_index)], a[i], temperature),
                  1e-4) << "seq " << i;
    }
  }
  // Where the engine multiplies by packed weights (CPU), a batch stays within the rows those
  // take: 12 prompts of 100 tokens go 5 (or fewer) to a forward; unpacked, all 12 in one.
  const std::vector<std::vector<int64_t>> hundred(12, prompt_of(base, 100));
  const int64_t packed_rows = m.pack_weights_for_decode().max_rows();
  if (GetParam().is_cpu()) {
    EXPECT_GE(packed_rows, 100) << "fp32 CPU weights are packed for decode";
  }
  SamplingParams p;
  p.max_new_tokens = 1;
  for (bool pack : {true, false}) {
    EngineOptions o{64, 0};
    o.pack_weights = pack;
    RolloutEngine engine(m, o);
    engine.generate(hundred, p);
    const int64_t per_forward = pack && packed_rows > 0 ? packed_rows / 100 : 12;
    EXPECT_EQ(engine.last_stats().prefill_forwards, (12 + per_forward - 1) / per_forward) << "pack_weights " << pack;
  }
}

// A prompt longer than max_num_batched_tokens is prefilled in chunks of that many tokens, each
// attending the chunks before it in the cache (vLLM's chunked prefill), shorter ones batched
// within it: the responses are those of whole-prompt prefills, greedy and sampled, each
// prompt's copies decoding from the chunked prompt, and the first token's log-prob is the full
// forward's. A budget of 1 prefills token by token (the decode step's path).
TEST_P(EngineTest, LongPromptsArePrefilledInChunksOfMaxNumBatchedTokens) {
  model::CausalLM m = load("qwen3_fp32");
  const auto base = prompts("qwen3_fp32")[2];  // 9 tokens
  const std::vector<std::vector<int64_t>> ps = {prompt_of(base, 30), prompt_of(base, 8), prompt_of(base, 31)};
  for (double temperature : {0.0, 1.0}) {
    const SamplingParams p = sampling(temperature, 2, 6, 9);
    RolloutEngine whole(m, {64, 0});
    const auto want = whole.generate(ps, p);
    EXPECT_EQ(whole.last_stats().prefill_forwards, 2);  // {8}, {30, 31}
    // budget -> forwards: the 8 tokens in one (or 8), 30 and 31 in ceil(len / budget) each
    for (const auto& [budget, forwards] : std::vector<std::pair<int64_t, int64_t>>{{8, 1 + 4 + 4}, {1, 8 + 30 + 31}}) {
      EngineOptions o{64, 0};
      o.max_num_batched_tokens = budget;
      RolloutEngine chunked(m, o);
      const auto got = chunked.generate(ps, p);
      const std::string what = "temperature " + std::to_string(temperature) + " budget " + std::to_string(budget);
      EXPECT_EQ(chunked.last_stats().prefill_forwards, forwards) << what;
      EXPECT_EQ(chunked.last_stats().prompt_tokens, 30 + 8 + 31) << what;
      ASSERT_EQ(got.size(), want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(got[i].token_ids, want[i].token_ids) << what << " seq " << i;
        for (size_t t = 0; t < got[i].log_probs.size(); ++t)
          EXPECT_NEAR(got[i].log_probs[t], want[i].log_probs[t], 1e-4) << what << " seq " << i << " token " << t;
        EXPECT_NEAR(got[i].log_probs[0],
                    first_token_log_prob(m, ps[static_cast<size_t>(got[i].prompt_index)], got[i], temperature), 1e-4)
            << what << " seq " << i;
      }
    }
  }
  EngineOptions bad{64, 0};
  bad.max_num_batched_tokens = 0;
  EXPECT_THROW(RolloutEngine(m, bad), ValueError);
}

// A share of the memory available when generate() starts (the trainer's and the CLI's KV
// budget) bounds the slots: the model's own K/V bytes per position (2 x layers x KV heads x head
// dim x 4 for fp32, from the checkpoint's config.json, not from rpg) times the longest prompt +
// max_new_tokens per slot (on the CPU the keys padded to whole blocks of 32 positions, the
// decode kernel's layout), out of the memory left after the packed copy of the weights (CPU).
// The responses are those of the unbounded engine; below one sequence it is a clear error.
TEST_P(EngineTest, KvBudgetBoundsTheSlotsNotTheResponses) {
  model::CausalLM m = load("qwen2_fp32");
  const auto cfg = nlohmann::json::parse(read_file(dir_ / "qwen2_fp32" / "config.json"));
  const int64_t heads = cfg["num_attention_heads"].get<int64_t>();
  const int64_t head_dim = cfg.contains("head_dim") ? cfg["head_dim"].get<int64_t>()
                                                    : cfg["hidden_size"].get<int64_t>() / heads;
  const int64_t per_token = 2 * cfg["num_hidden_layers"].get<int64_t>() * cfg["num_key_value_heads"].get<int64_t>() *
                            head_dim * 4;
  EXPECT_EQ(m.kv_cache_bytes_per_token(), per_token);
  SamplingParams p;
  p.temperature = 1.0;
  p.n = 4;
  p.max_new_tokens = 10;
  p.seed = 9;
  const auto ps = prompts("qwen2_fp32");
  size_t longest = 0;
  for (const auto& q : ps) longest = std::max(longest, q.size());
  const int64_t capacity = static_cast<int64_t>(longest) + p.max_new_tokens;
  // The CPU decode kernel keeps keys in blocks of 32 positions (model/decode_attention.h).
  const bool blocked = model::decode_attention_supports(at::kFloat, GetParam());
  const int64_t key_positions = blocked ? (capacity + 31) / 32 * 32 : capacity;
  const double per_sequence = static_cast<double>((capacity + key_positions) * (per_token / 2));
  EXPECT_EQ(m.kv_cache_bytes_per_sequence(capacity), static_cast<int64_t>(per_sequence));

  RolloutEngine unbounded(m, {64, 0});
  const auto want = unbounded.generate(ps, p);
  EXPECT_FALSE(unbounded.last_stats().slots_cut_by_kv_budget);
  // Every sequence is admitted at once: its first token comes from the prefill, the other 9
  // from 9 decode steps, timed apart from the admission.
  const GenerateStats all = unbounded.last_stats();
  EXPECT_EQ(all.decode_steps, 9);
  EXPECT_GT(all.decode_seconds, 0.0);
  EXPECT_LE(all.decode_seconds, all.seconds);

  const bool cuda = GetParam().is_cuda();
  const auto avail = device::available_memory(cuda, cuda ? GetParam().index() : 0);
  ASSERT_TRUE(avail.has_value());
  double packs = 0;  // the engine packs the weights for the CPU GEMM before it allocates the cache
  if (!cuda)
    for (const auto& w : m.parameters()) packs += static_cast<double>(w.numel() * 4);
  // A fraction with room for `sequences` sequences.
  auto share = [&](double sequences) {
    EngineOptions o{64, 0};
    o.kv_cache_memory_fraction = sequences * per_sequence / (static_cast<double>(*avail) - packs);
    return o;
  };
  for (const auto& [room, slots] : {std::pair{2.5, 2}, std::pair{1.1, 1}}) {
    const EngineOptions o = share(room);
    const auto budget = kv_budget_bytes(m, o);
    ASSERT_TRUE(budget.has_value());
    EXPECT_NEAR(static_cast<double>(*budget), room * per_sequence, 0.05 * per_sequence);
    RolloutEngine bounded(m, o);
    const auto got = bounded.generate(ps, p);
    EXPECT_EQ(bounded.last_stats().slots, slots) << room;
    EXPECT_TRUE(bounded.last_stats().slots_cut_by_kv_budget);
    // In groups of `slots`, 9 steps each.
    EXPECT_EQ(bounded.last_stats().decode_steps, static_cast<int64_t>(want.size()) / slots * 9) << room;
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i].token_ids, want[i].token_ids) << room << " seq " << i;
  }
  EngineOptions o{64, 0};
  EXPECT_FALSE(kv_budget_bytes(m, o).has_value());  // fraction 0: no bound
  o.kv_cache_memory_fraction = 1.5;
  EXPECT_THROW(RolloutEngine(m, o), ValueError);

  RolloutEngine tiny(m, share(0.9));
  try {
    tiny.generate(ps, p);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot hold one sequence of " + std::to_string(longest + 10) + " tokens"),
              std::string::npos)
        << e.what();
  }
}

// Fixed-slot decoding (every slot each step, sampling on the device from a tensor of
// uniforms) gives the eager engine's responses: the same tokens from the same streams, the
// same finish reasons, log-probs equal within rounding (attention spans a part of the cache
// under a mask: the smallest of its spans that holds every write position, so a span chosen
// too short would drop keys), for any slot count (slots reused as sequences finish). On CUDA
// the same holds for the steps replayed from CUDA graphs, one captured per span used;
// elsewhere that mode is refused up front. The prompts (1-9 tokens) and responses (10-12)
// cross spans: a cache of 19-21 positions is attended in spans of 8, 16 and the capacity.
TEST_P(EngineTest, FixedSlotDecodingGivesTheEagerResponses) {
  const double tol = test::fp32_tol(GetParam(), 1e-5);
  size_t stopped = 0;  // responses that ended at the stop token, freeing their slot early
  for (const auto& name : kModels) {
    model::CausalLM m = load(name);
    SamplingParams sampled;
    sampled.temperature = 1.0;
    sampled.top_p = 0.9;
    sampled.top_k = 50;
    sampled.n = 3;
    sampled.max_new_tokens = 12;
    sampled.seed = 7;
    sampled.stop_token_ids = {(*ref_)[name]["eos"].get<int64_t>()};
    SamplingParams greedy;
    greedy.temperature = 0;
    greedy.max_new_tokens = 10;
    std::vector<EngineOptions> modes;
    for (int64_t slots : {1, 3, 8}) {
      EngineOptions o{slots, 0};
      o.fixed_slots = true;
      modes.push_back(o);
      if (GetParam().is_cuda()) {
        o.cuda_graph = true;
        modes.push_back(o);
      }
    }
    for (const SamplingParams& p : {sampled, greedy}) {
      const auto want = RolloutEngine(m, {4, 0}).generate(prompts(name), p);
      for (const auto& r : want) stopped += r.finish_reason == FinishReason::kStop;
      for (const EngineOptions& o : modes) {
        const std::string what = name + (p.temperature > 0 ? " sampled" : " greedy") + " slots " +
                                  std::to_string(o.max_num_seqs) + (o.cuda_graph ? " cuda graph" : "");
        RolloutEngine engine(m, o);
        const auto got = engine.generate(prompts(name), p);
        const GenerateStats& st = engine.last_stats();
        const int64_t capacity = 9 + p.max_new_tokens;
        EXPECT_LT(st.attended_positions, st.decode_steps * capacity) << what << ": every step attended the capacity";
        EXPECT_GT(st.attended_positions, st.decode_steps * 8) << what << ": no step attended beyond the first span";
        if (o.cuda_graph) {
          EXPECT_GE(st.graphs_captured, 2) << what;
          EXPECT_LE(st.graphs_captured, 3) << what;
        } else {
          EXPECT_EQ(st.graphs_captured, 0) << what;
        }
        ASSERT_EQ(got.size(), want.size()) << what;
        for (size_t i = 0; i < got.size(); ++i) {
          ASSERT_EQ(got[i].token_ids, want[i].token_ids) << what << " seq " << i;
          EXPECT_EQ(got[i].finish_reason, want[i].finish_reason) << what << " seq " << i;
          EXPECT_EQ(got[i].prompt_index, want[i].prompt_index);
          EXPECT_EQ(got[i].sample_index, want[i].sample_index);
          for (size_t t = 0; t < got[i].log_probs.size(); ++t)
            EXPECT_NEAR(got[i].log_probs[t], want[i].log_probs[t], tol) << what << " seq " << i << " token " << t;
        }
      }
    }
  }
  EXPECT_GT(stopped, 0u) << "no response hit the stop token";
  if (!GetParam().is_cuda()) {
    model::CausalLM m = load("qwen2_fp32");
    EngineOptions o;
    o.cuda_graph = true;
    try {
      RolloutEngine engine(m, o);
      FAIL() << "cuda_graph accepted on " << GetParam().str();
    } catch (const ValueError& e) {
      EXPECT_NE(std::string(e.what()).find("cuda_graph: needs a model on CUDA"), std::string::npos) << e.what();
    }
  }
}

TEST_P(EngineTest, BadRequestsAreValueErrors) {
  model::CausalLM m = load("qwen2_fp32");
  RolloutEngine engine(m, {2, 0});
  auto error_of = [&](std::vector<std::vector<int64_t>> prompts, SamplingParams p) -> std::string {
    try {
      engine.generate(prompts, p);
    } catch (const ValueError& e) {
      return e.what();
    }
    return "<no error>";
  };
  SamplingParams p;
  p.max_new_tokens = 8;
  EXPECT_NE(error_of({std::vector<int64_t>(300, 5)}, p).find("exceeds the model context of 256"), std::string::npos);
  EXPECT_NE(error_of({{}}, p).find("prompt 0 is empty"), std::string::npos);
  EXPECT_NE(error_of({{1, 2, 9999}}, p).find("token id 9999 outside the vocabulary"), std::string::npos);
  SamplingParams q = p;
  q.max_new_tokens = 0;
  EXPECT_NE(error_of({{1, 2}}, q).find("max_new_tokens"), std::string::npos);
  q = p;
  q.top_p = 0;
  EXPECT_NE(error_of({{1, 2}}, q).find("top_p"), std::string::npos);
  q = p;
  q.n = 0;
  EXPECT_NE(error_of({{1, 2}}, q).find("n: must be >= 1"), std::string::npos);
  RolloutEngine tiny(m, {4, 5});
  try {
    tiny.generate({{1, 2, 3}}, p);
    FAIL() << "no error";
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("max_kv_tokens=5 cannot hold one sequence of 11 tokens"), std::string::npos)
        << e.what();
  }
}

// bf16 rollouts: the engine on the fp32 checkpoint cast to bf16 (weights and KV cache in
// bf16) picks transformers' greedy tokens with the same bf16 weights, wherever the top-2 logit
// gap exceeds bf16 resolution (the oracle's "trusted" prefix of each response; below it two
// valid bf16 summation orders may pick differently).
TEST(EngineBf16, GreedyEqualsTransformersBf16WhereTheGapExceedsBf16Resolution) {
  const fs::path dir = test::oracle_output_dir("rollout_hf_generate_bf16.py");
  const auto ref = nlohmann::json::parse(read_file(dir / "generate_bf16.json"));
  for (const std::string name : {"qwen2_fp32", "qwen3_fp32", "llama3_fp32"}) {
    model::CausalLM m = model::CausalLM::from_pretrained(dir / name, {at::kBFloat16, at::kCPU});
    ASSERT_EQ(m.dtype(), at::kBFloat16);
    const auto prompts = ref[name]["prompts"].get<std::vector<std::vector<int64_t>>>();
    const auto expected = ref[name]["greedy"].get<std::vector<std::vector<int64_t>>>();
    const auto trusted = ref[name]["trusted"].get<std::vector<int64_t>>();
    RolloutEngine engine(m, {4, 0});
    SamplingParams p;
    p.temperature = 0;
    p.max_new_tokens = static_cast<int64_t>(expected[0].size());
    p.ignore_eos = true;
    const auto out = engine.generate(prompts, p);
    ASSERT_EQ(out.size(), expected.size());
    int64_t compared = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      const auto n = static_cast<size_t>(trusted[i]);
      ASSERT_GE(out[i].token_ids.size(), n);
      EXPECT_EQ(std::vector<int64_t>(out[i].token_ids.begin(), out[i].token_ids.begin() + n),
                std::vector<int64_t>(expected[i].begin(), expected[i].begin() + n))
          << name << " prompt " << i << ": the first " << n << " tokens";
      compared += trusted[i];
    }
    EXPECT_GE(compared, 16) << name << ": too few tokens with a clear top-2 gap to compare";
  }
}

}  // namespace
}  // namespace rpg::rollout
