// rpg's side of the roofline benchmark (bench/roofline/roofline.py runs it, measures the
// machine's peak and transformers on the same shapes, and turns seconds into FLOP/s and %
// of peak; the FLOP model lives there, once, for both sides).
//
//   roofline_bench --model DIR [--threads 2] [--phases decode,prefill,logprob,update,optimizer,gemm]
//                  [--decode-seqs 1,8,64] [--new-tokens 64] [--prompt-len 128]
//                  [--prefill-seqs 8] [--rows 16] [--response 128] [--group 1] [--repeats 3] [--ops 0]
//                  [--dtype float32] [--warmup 1] [--checkpointing 0] [--ops-by-shape 0]
//                  [--pack-weights 1] [--keep-logits-mb 1024]
//
// Prints one JSON object per measurement (median seconds of --repeats after a warm-up):
//   decode:  the engine's generate() for one prompt x n=S at fixed length (EOS ignored), with
//            --new-tokens and with 1 new token; decode seconds = their difference, over
//            (new_tokens - 1) steps of S sequences (the prefill cancels out).
//            step_seconds: the mean of those steps timed alone in the last timed run
//            (GenerateStats::decode_seconds; admission and prefill excluded).
//   prefill: one decode() call over --prefill-seqs prompts of --prompt-len tokens (last-token logits).
//   logprob: CausalLM::log_probs without autograd (old / reference log-probs) on --rows rows of
//            prompt-len + response tokens, rows in groups of --group sharing a prompt.
//   update:  the same with autograd, entropy, a GRPO-like loss and backward.
//   gemm:    a decode step's products alone: --decode-seqs rows through every packed weight
//            of the model (q/k/v/o/gate/up/down per layer and the lm_head, cold from memory as
//            in decode), once per packed backend this CPU has (rpg's panels, MKL's packed
//            GEMM; model/packed_gemm.h); seconds per step and GFLOP/s.
//   attention: one layer's decode attention alone (model/decode_attention.h) at the model's head
//            shape, for --decode-seqs rows of --prompt-len + --new-tokens keys each; with --group
//            G > 1 the first --prompt-len keys are one prompt shared by each G rows (as the engine
//            decodes n samples), else every key is the row's own. Enough copies of the caches are
//            cycled through that each call reads its keys and values from memory, as a decode
//            step does; seconds per call, GB/s of keys and values read, GFLOP/s.
// --ops K adds the K aten ops with the most self time in each measurement (Kineto), to
// show where the time goes.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <algorithm>
#include <chrono>
#include <iostream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "rpg/core/args.h"
#include "rpg/core/malloc_env.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/decode_attention.h"
#include "rpg/model/packed_gemm.h"
#include "rpg/rollout/engine.h"
#include "rpg/train/optim.h"

namespace {

using rpg::model::CausalLM;
namespace prof = torch::autograd::profiler;

std::vector<int64_t> parse_list(const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoll(item));
  return out;
}

double seconds_of(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double median_seconds(const std::function<void()>& f, int repeats, bool warmup) {
  if (warmup) f();  // allocator, MKL buffers, first-touch pages
  std::vector<double> t;
  for (int i = 0; i < repeats; ++i) t.push_back(seconds_of(f));
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string with_shapes(const std::string& name, c10::ArrayRef<std::vector<int64_t>> shapes) {
  std::string s = name;
  for (const auto& shape : shapes) {
    s += " [";
    for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
    s += "]";
  }
  return s;
}

// Self time per op name of one run of f: an event's duration minus its children's (events
// nest on a thread by time), summed by name; the top k by self time.
// With by_shape, ops are told apart by their input shapes too ("aten::mul [32,96,576] [576]").
nlohmann::json op_profile(const std::function<void()>& f, int64_t k, bool by_shape) {
  const std::set<torch::profiler::impl::ActivityType> cpu{torch::profiler::impl::ActivityType::CPU};
  const torch::profiler::impl::ProfilerConfig config(torch::profiler::impl::ProfilerState::KINETO, by_shape);
  prof::prepareProfiler(config, cpu);
  prof::enableProfiler(config, cpu);
  f();
  auto result = prof::disableProfiler();
  struct Ev {
    uint64_t start, end, tid;
    std::string name;
  };
  std::vector<Ev> evs;
  for (const auto& e : result->events())
    if (e.deviceType() == c10::DeviceType::CPU && e.durationNs() > 0)
      evs.push_back({e.startNs(), e.endNs(), e.startThreadId(), by_shape ? with_shapes(e.name(), e.shapes()) : e.name()});
  std::sort(evs.begin(), evs.end(), [](const Ev& a, const Ev& b) {
    return a.tid != b.tid ? a.tid < b.tid : a.start != b.start ? a.start < b.start : a.end > b.end;
  });
  std::map<std::string, std::pair<double, int64_t>> self;  // name -> (ms, calls)
  std::vector<std::pair<size_t, double>> stack;            // (event, children ns)
  auto pop = [&] {
    const Ev& e = evs[stack.back().first];
    const double own = static_cast<double>(e.end - e.start) - stack.back().second;
    auto& s = self[e.name];
    s.first += own * 1e-6;
    s.second += 1;
    const double dur = static_cast<double>(e.end - e.start);
    stack.pop_back();
    if (!stack.empty()) stack.back().second += dur;
  };
  for (size_t i = 0; i < evs.size(); ++i) {
    while (!stack.empty() &&
           (evs[stack.back().first].tid != evs[i].tid || evs[stack.back().first].end <= evs[i].start))
      pop();
    stack.push_back({i, 0.0});
  }
  while (!stack.empty()) pop();
  std::vector<std::pair<std::string, std::pair<double, int64_t>>> rows(self.begin(), self.end());
  std::sort(rows.begin(), rows.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < rows.size() && static_cast<int64_t>(i) < k; ++i)
    out.push_back({rows[i].first, rows[i].second.first, rows[i].second.second});
  return out;
}

struct Bench {
  int repeats;
  int64_t ops;
  bool warmup;
  bool ops_by_shape;
  double median(const std::function<void()>& f) const { return median_seconds(f, repeats, warmup); }

  void emit(nlohmann::json j, const std::function<void()>& f, double seconds) {
    j["seconds"] = seconds;
    if (ops > 0) j["ops"] = op_profile(f, ops, ops_by_shape);
    std::cout << j.dump() << std::endl;
  }
};

}  // namespace

int main(int argc, char** argv) {
  rpg::malloc_env::keep_freed_memory();  // as rpg-torch does (core/malloc_env.h)
  std::string model_dir, phases = "decode,prefill,logprob,update", decode_seqs = "1,8,64", dtype = "float32";
  int64_t threads = 2, new_tokens = 64, prompt_len = 128, prefill_seqs = 8, rows = 16, response = 128, group = 1,
          repeats = 3, ops = 0, warmup = 1, checkpointing = 0, ops_by_shape = 0, pack_weights = 1,
          keep_logits_mb = rpg::model::LogProbOptions{}.keep_logits_bytes >> 20;
  rpg::ArgParser parser("roofline_bench", "rpg's phases on a model directory, in seconds (bench/roofline/roofline.py)");
  parser.option("--model", &model_dir, "model directory", "DIR")
      .option("--threads", &threads, "intra-op threads")
      .option("--phases", &phases, "comma-separated: decode, prefill, logprob, update, optimizer, gemm, attention",
              "LIST")
      .option("--decode-seqs", &decode_seqs, "sequences decoding together, comma-separated", "LIST")
      .option("--new-tokens", &new_tokens, "tokens per response in decode")
      .option("--prompt-len", &prompt_len, "prompt tokens")
      .option("--rows", &rows, "rows of the log-prob and update passes")
      .option("--response", &response, "response tokens per row of the log-prob and update passes")
      .option("--prefill-seqs", &prefill_seqs, "prompts of the prefill")
      .option("--group", &group, "log-prob / update rows sharing a prompt (rpg computes it once)")
      .option("--repeats", &repeats, "timed runs per measurement (median)")
      .option("--ops", &ops, "also profile: the K ops with the most self time")
      .option("--pack-weights", &pack_weights, "0: decode without packing the weights per generate() (EngineOptions)")
      .option("--keep-logits-mb", &keep_logits_mb,
              "update: keep the lm_head's log-probs for the backward up to this size (LogProbOptions); 0 recomputes")
      .option("--ops-by-shape", &ops_by_shape, "1: --ops tells ops apart by their input shapes too")
      .option("--dtype", &dtype, "float32 | bfloat16", "DTYPE")
      .option("--warmup", &warmup, "1: one untimed run before the timed ones; 0: none (cold, as a step is)")
      .option("--checkpointing", &checkpointing, "1: gradient checkpointing in the update (rpg train's option)");
  try {
    if (!parser.parse(std::vector<std::string>(argv + 1, argv + argc))) return 0;
    if (model_dir.empty()) throw std::invalid_argument("--model is required");
    if (new_tokens < 2 || prompt_len < 2 || prefill_seqs < 1 || rows < 1 || response < 1 || group < 1 || repeats < 1)
      throw std::invalid_argument("--new-tokens and --prompt-len must be >= 2, the other counts >= 1");
    at::set_num_threads(static_cast<int>(threads));
    rpg::model::LoadOptions lo;
    if (dtype == "float32") lo.dtype = at::kFloat;
    else if (dtype == "bfloat16") lo.dtype = at::kBFloat16;
    else throw std::invalid_argument("--dtype: float32 or bfloat16, not '" + dtype + "'");
    CausalLM model = CausalLM::from_pretrained(model_dir, lo);
    const int64_t V = model.config().vocab_size;
    model.set_gradient_checkpointing(checkpointing != 0);
    Bench b{static_cast<int>(repeats), ops, warmup != 0, ops_by_shape != 0};
    at::manual_seed(0);
    const at::Tensor prompt_ids = at::randint(1, V, {prefill_seqs, prompt_len}, at::kLong);
    const std::set<std::string> want = [&] {
      std::set<std::string> s;
      std::stringstream ss(phases);
      std::string p;
      while (std::getline(ss, p, ',')) s.insert(p);
      return s;
    }();

    if (want.count("decode")) {
      const auto p0 = prompt_ids[0];
      const std::vector<int64_t> prompt(p0.data_ptr<int64_t>(), p0.data_ptr<int64_t>() + prompt_len);
      for (int64_t S : parse_list(decode_seqs)) {
        rpg::rollout::EngineOptions eo;
        eo.max_num_seqs = S;
        eo.pack_weights = pack_weights != 0;
        rpg::rollout::RolloutEngine engine(model, eo);
        rpg::rollout::SamplingParams sp;
        sp.n = S;
        sp.ignore_eos = true;
        auto run = [&](int64_t tokens) {
          sp.max_new_tokens = tokens;
          return [&engine, &prompt, sp] { engine.generate({prompt}, sp); };
        };
        const double full = b.median(run(new_tokens));
        const auto steps = engine.last_stats();  // the last timed generate(new_tokens)
        const double first = b.median(run(1));
        b.emit({{"phase", "decode"}, {"seqs", S}, {"prompt_len", prompt_len}, {"new_tokens", new_tokens},
                {"generate_seconds", full}, {"prefill_seconds", first},
                {"step_seconds", steps.decode_seconds / static_cast<double>(std::max<int64_t>(1, steps.decode_steps))}},
               run(new_tokens), full - first);
      }
    }
    if (want.count("gemm")) {
      std::vector<at::Tensor> weights;
      for (const auto& [name, t] : model.named_parameters())
        if (t.dim() == 2 && (name.find("_proj.weight") != std::string::npos || name == "lm_head.weight" ||
                             (name == "model.embed_tokens.weight" && model.config().tie_word_embeddings)))
          weights.push_back(t.detach());
      for (auto backend : {rpg::model::detail::PackedBackend::kPanels512, rpg::model::detail::PackedBackend::kPanels,
                           rpg::model::detail::PackedBackend::kMkl, rpg::model::detail::PackedBackend::kPanelsBf16,
                           rpg::model::detail::PackedBackend::kAmxBf16}) {
        if (!rpg::model::detail::packed_backend_usable(backend)) continue;
        // The bf16 backends multiply bf16 weights and inputs (a bf16 rollout's decode).
        const at::ScalarType wt = backend == rpg::model::detail::PackedBackend::kPanelsBf16 ||
                                          backend == rpg::model::detail::PackedBackend::kAmxBf16
                                      ? at::kBFloat16
                                      : at::kFloat;
        std::vector<rpg::model::detail::PackedWeight> packed;
        for (const auto& w : weights) packed.push_back(rpg::model::detail::PackedWeight::pack(w.to(wt), backend));
        for (int64_t S : parse_list(decode_seqs)) {
          double flops = 0;
          for (const auto& w : weights) flops += 2.0 * static_cast<double>(S * w.numel());
          std::map<int64_t, at::Tensor> inputs;
          for (const auto& w : weights) inputs.emplace(w.size(1), at::randn({S, w.size(1)}).to(wt));
          auto f = [&] {
            for (size_t i = 0; i < packed.size(); ++i) packed[i].linear(inputs.at(weights[i].size(1)), {});
          };
          const double sec = b.median(f);
          b.emit({{"phase", "gemm"}, {"backend", rpg::model::detail::packed_backend_name(backend)}, {"seqs", S},
                  {"weights", weights.size()}, {"gflops", flops / sec / 1e9}, {"prompt_len", 0}},
                 f, sec);
        }
      }
    }
    if (want.count("attention")) {
      const auto& c = model.config();
      const int64_t H = c.num_attention_heads, Hkv = c.num_key_value_heads, D = c.head_dim;
      const int64_t n = prompt_len + new_tokens, cap = rpg::model::key_blocks(n) * rpg::model::kKeyBlock;
      const at::ScalarType dt = lo.dtype.value_or(at::kFloat);
      for (int64_t S : parse_list(decode_seqs)) {
        // Slots: each row's own; a group's prompt is read from its first row's slot.
        const int64_t bytes_per_copy = S * Hkv * cap * D * 2 * static_cast<int64_t>(c10::elementSize(dt));
        const int64_t copies = std::max<int64_t>(2, (int64_t{512} << 20) / std::max<int64_t>(1, bytes_per_copy));
        struct Copy {
          at::Tensor kt, v;
        };
        std::vector<Copy> caches;
        for (int64_t i = 0; i < copies; ++i) {
          at::Tensor k = at::randn({S, Hkv, cap, D}).to(dt);
          caches.push_back({rpg::model::block_keys(k), at::randn({S, Hkv, cap, D}).to(dt)});
        }
        const at::Tensor q = at::randn({S, H, D}).to(dt);
        const at::Tensor slots = at::arange(S, at::kLong), positions = at::full({S}, n - 1, at::kLong);
        rpg::model::SharedPrefix prefix;
        if (group > 1) {
          prefix.slots = at::floor_divide(slots, group) * group;
          prefix.lengths = at::full({S}, prompt_len, at::kLong);
        }
        int64_t next = 0;
        auto f = [&] {
          const Copy& cc = caches[static_cast<size_t>(next++ % copies)];
          rpg::model::decode_attention(q, cc.kt, cc.v, slots, positions, prefix);
        };
        const double sec = b.median(f);
        // Bytes read once per call: every row's own keys and values, a shared prompt once per group.
        const int64_t read_positions = group > 1 ? (S + group - 1) / group * prompt_len + S * new_tokens : S * n;
        const double bytes = static_cast<double>(read_positions * Hkv * D * 2 * c10::elementSize(dt));
        const double flops = 4.0 * static_cast<double>(S * H * n * D);
        b.emit({{"phase", "attention"}, {"seqs", S}, {"prompt_len", prompt_len}, {"new_tokens", new_tokens},
                {"group", group}, {"heads", H}, {"kv_heads", Hkv}, {"head_dim", D}, {"copies", copies},
                {"gbs", bytes / sec / 1e9}, {"gflops", flops / sec / 1e9}},
               f, sec);
      }
    }
    if (want.count("prefill")) {
      auto f = [&] {
        auto cache = model.new_cache(prefill_seqs, prompt_len);
        std::vector<int64_t> slots(static_cast<size_t>(prefill_seqs));
        for (int64_t i = 0; i < prefill_seqs; ++i) slots[static_cast<size_t>(i)] = i;
        CausalLM::DecodeOptions o;
        o.last_only = true;
        model.decode(cache, slots, prompt_ids, o);
      };
      b.emit({{"phase", "prefill"}, {"seqs", prefill_seqs}, {"prompt_len", prompt_len}}, f, b.median(f));
    }
    if (want.count("logprob") || want.count("update")) {
      // Rows in groups sharing a prompt (GRPO's layout), full length, no padding: both sides
      // do the same useful work, and the FLOP count needs no masks.
      const int64_t T = prompt_len + response;
      at::Tensor ids = at::randint(1, V, {rows, T}, at::kLong);
      for (int64_t r = 0; r < rows; ++r) ids[r].narrow(0, 0, prompt_len).copy_(ids[r / group * group].narrow(0, 0, prompt_len));
      const at::Tensor mask = at::ones({rows, T}, at::kLong);
      const at::Tensor pos = at::arange(T, at::kLong).unsqueeze(0).expand({rows, T}).contiguous();
      const at::Tensor targets = ids.narrow(1, prompt_len, response).contiguous();
      const at::Tensor adv = at::randn({rows, 1}).expand({rows, response});
      const nlohmann::json shape = {{"rows", rows}, {"prompt_len", prompt_len}, {"response", response}, {"group", group}};
      if (want.count("logprob")) {
        auto f = [&] {
          c10::NoGradGuard no_grad;
          model.log_probs(ids, mask, pos, targets);
        };
        nlohmann::json j = shape;
        j["phase"] = "logprob";
        b.emit(j, f, b.median(f));
      }
      if (want.count("update")) {
        auto f = [&] {
          rpg::model::LogProbOptions o;
          o.with_entropy = true;
          o.keep_logits_bytes = keep_logits_mb << 20;
          auto out = model.log_probs(ids, mask, pos, targets, o);
          at::Tensor ratio = (out.log_probs - out.log_probs.detach()).exp();
          at::Tensor loss = (-adv * ratio).mean() - 1e-3 * out.entropy.mean();
          loss.backward();
          for (auto& p : model.parameters()) p.mutable_grad() = at::Tensor();
        };
        nlohmann::json j = shape;
        j["phase"] = "update";
        j["keep_logits_mb"] = keep_logits_mb;
        b.emit(j, f, b.median(f));
      }
    }
    if (want.count("optimizer")) {
      // AdamW's step over every parameter, random gradients: memory-bound (parameter,
      // gradient and both moments read, three of them written).
      for (auto& p : model.parameters()) p.mutable_grad() = at::randn_like(p);
      rpg::train::OptimizerOptions oo;
      oo.weight_decay = 0.01;
      auto opt = rpg::train::make_optimizer(oo, model.named_parameters());
      auto f = [&] { opt->step(1e-6); };
      int64_t params = 0;
      for (const auto& p : model.parameters()) params += p.numel();
      b.emit({{"phase", "optimizer"}, {"params", params}, {"prompt_len", 0}}, f, b.median(f));
    }
  } catch (const std::exception& ex) {
    std::cerr << "roofline_bench: error: " << ex.what() << "\n";
    return 1;
  }
  return 0;
}
