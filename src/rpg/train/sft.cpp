#include "rpg/train/sft.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>

#include "rpg/core/error.h"
#include "rpg/core/signals.h"
#include "rpg/core/io.h"
#include "rpg/core/jsonl.h"
#include "rpg/core/log.h"
#include "rpg/core/metrics.h"
#include "rpg/core/progress.h"
#include "rpg/core/rng.h"
#include "rpg/model/causal_lm.h"
#include "rpg/rollout/batch.h"
#include "rpg/rollout/policy.h"
#include "rpg/rollout/response.h"
#include "rpg/train/optim.h"

#include <nlohmann/json.hpp>

namespace fs = std::filesystem;

namespace rpg::train {
namespace {

void validate(const SftOptions& o) {
  if (!(o.lr > 0) || !std::isfinite(o.lr)) throw ConfigError(str("sft: lr must be > 0, got ", o.lr));
  if (o.epochs < 1) throw ConfigError(str("sft: epochs must be >= 1, got ", o.epochs));
  if (o.batch_size < 1) throw ConfigError(str("sft: batch size must be >= 1, got ", o.batch_size));
  if (o.micro_batch_size < 1) throw ConfigError(str("sft: micro batch size must be >= 1, got ", o.micro_batch_size));
  // A prompt token and the EOS at least.
  if (o.max_length < 2) throw ConfigError(str("sft: max length must be >= 2, got ", o.max_length));
  if (o.steps && *o.steps < 1) throw ConfigError(str("sft: steps must be >= 1, got ", *o.steps));
  if (o.warmup_ratio < 0 || o.warmup_ratio > 1)
    throw ConfigError(str("sft: warmup ratio must be in [0, 1], got ", o.warmup_ratio));
  if (o.weight_decay < 0) throw ConfigError(str("sft: weight decay must be >= 0, got ", o.weight_decay));
  if (!(o.grad_clip > 0)) throw ConfigError(str("sft: grad clip must be > 0, got ", o.grad_clip));
  if (o.lr_scheduler != "cosine" && o.lr_scheduler != "constant")
    throw ConfigError(str("sft: lr scheduler '", o.lr_scheduler, "' is not one of: cosine, constant"));
}

}  // namespace

std::vector<SftPair> read_sft_jsonl(const fs::path& file) {
  std::vector<SftPair> pairs;
  jsonl::for_each(file, [&](size_t line_no, nlohmann::json& j) {
    const std::string where = str(file.string(), ":", line_no, ": ");
    SftPair p;
    for (const char* key : {"prompt", "response"}) {
      auto it = j.find(key);
      if (it == j.end()) throw FormatError(str(where, "missing \"", key, "\""));
      if (!it->is_string()) throw FormatError(str(where, "\"", key, "\" must be a string, got ", it->type_name()));
    }
    p.prompt = j["prompt"].get<std::string>();
    p.response = j["response"].get<std::string>();
    pairs.push_back(std::move(p));
  }, {.allow_torn_last_line = false});
  if (pairs.empty()) throw FormatError(str(file.string(), ": no (prompt, response) pairs"));
  return pairs;
}

std::vector<SftExample> encode_sft_pairs(const rollout::Policy& policy, const std::vector<SftPair>& pairs) {
  int64_t eos = -1;
  if (auto id = policy.tokenizer.eos_id()) eos = *id;
  else if (!policy.stop_token_ids.empty()) eos = policy.stop_token_ids.front();
  else throw ValueError("sft: the tokenizer has no EOS token, so a fine-tuned model could not learn to stop");
  std::vector<SftExample> out;
  out.reserve(pairs.size());
  for (const auto& p : pairs) {
    SftExample e;
    e.prompt_ids = rollout::render_prompt(policy.tokenizer, {{"user", p.prompt}});
    // Encoded apart from the prompt, as verl's SFTDataset does, so the boundary tokens are
    // those generation will see after the rendered prompt.
    for (auto t : policy.tokenizer.encode(p.response)) e.response_ids.push_back(t);
    e.response_ids.push_back(eos);
    out.push_back(std::move(e));
  }
  return out;
}

SftBatchResult sft_backward(const model::CausalLM& model, const std::vector<const SftExample*>& batch,
                            int64_t pad_token_id, int64_t micro_batch_size) {
  SftBatchResult result;
  for (const auto* e : batch) result.tokens += static_cast<int64_t>(e->response_ids.size());
  if (result.tokens == 0) return result;
  const auto device = model.device();
  // Summed in double on the device and read once after the last micro-batch (a .item() per
  // micro-batch would wait for each backward on CUDA); the same additions as a host double.
  at::Tensor loss_sum = at::zeros({}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const auto& rows : rollout::split_by_rows(static_cast<int64_t>(batch.size()), micro_batch_size)) {
    std::vector<std::vector<int64_t>> prompts;
    std::vector<rollout::Response> responses;
    for (int64_t r : rows) {
      const SftExample& e = *batch[static_cast<size_t>(r)];
      rollout::Response resp;
      resp.prompt_index = static_cast<int64_t>(prompts.size());
      resp.token_ids = e.response_ids;
      resp.log_probs.assign(e.response_ids.size(), 0.0f);
      prompts.push_back(e.prompt_ids);
      responses.push_back(std::move(resp));
    }
    rollout::Batch mb = rollout::make_rollout_batch(prompts, responses, pad_token_id);
    auto lp = model.log_probs(mb.get("input_ids").to(device), mb.get("attention_mask").to(device),
                              mb.get("position_ids").to(device), mb.get("responses").to(device));
    at::Tensor mask = mb.get("response_mask").to(device, at::kFloat);
    at::Tensor nll = -(lp.log_probs * mask).sum();
    // The whole batch's token count: micro-batches only accumulate.
    (nll / static_cast<double>(result.tokens)).backward();
    loss_sum += nll.detach().to(at::kDouble);
  }
  result.loss = loss_sum.item<double>() / static_cast<double>(result.tokens);
  return result;
}

SftResult run_sft(const fs::path& model_dir, const fs::path& data_file, const fs::path& out_dir,
                  const SftOptions& options) {
  validate(options);
  auto pairs = read_sft_jsonl(data_file);
  rollout::Policy policy = rollout::load_policy(model_dir, options.dtype, options.device);
  at::manual_seed(static_cast<uint64_t>(options.seed));
  policy.model.set_requires_grad(true);
  policy.model.set_gradient_checkpointing(options.gradient_checkpointing);

  SftResult result;
  std::vector<SftExample> examples;
  for (auto& e : encode_sft_pairs(policy, pairs)) {
    if (static_cast<int64_t>(e.prompt_ids.size() + e.response_ids.size()) > options.max_length) ++result.dropped;
    else examples.push_back(std::move(e));
  }
  if (result.dropped > 0)
    log_warn(str("sft: dropped ", result.dropped, " of ", pairs.size(), " pairs longer than max length ",
                 options.max_length, " tokens"));
  if (examples.empty())
    throw ValueError(str("sft: no pair of ", data_file.string(), " fits max length ", options.max_length, " tokens"));

  const int64_t n = static_cast<int64_t>(examples.size());
  const int64_t steps_per_epoch = (n + options.batch_size - 1) / options.batch_size;
  const int64_t total = options.steps.value_or(options.epochs * steps_per_epoch);
  const int64_t warmup = resolve_warmup_steps(0, options.warmup_ratio, total);
  OptimizerOptions oo;
  oo.type = options.optimizer;
  oo.lr = options.lr;
  oo.weight_decay = options.weight_decay;
  oo.warmup_steps = warmup;
  auto optimizer = make_optimizer(oo, policy.model.named_parameters());
  const LrSchedule schedule{options.lr_scheduler, warmup, total, options.min_lr_ratio, 0.5};

  fs::create_directories(out_dir);
  MetricsLogger logger(out_dir, /*tensorboard=*/true);
  log_info(str("sft: ", n, " pairs, ", steps_per_epoch, " steps per epoch, ", total, " steps, batch ",
               options.batch_size, " (micro ", options.micro_batch_size, "), lr ", options.lr, " (", options.lr_scheduler,
               ", ", warmup, " warm-up steps); output ", out_dir.string()));

  std::optional<ProgressBar> bar;
  if (options.progress) bar.emplace("sft", total, "step");
  int64_t epoch = 0, cursor = 0;
  auto shuffle = [&](int64_t e) {
    return random_permutation(n, mix_key(static_cast<uint64_t>(options.seed), static_cast<uint64_t>(e)));
  };
  std::vector<int64_t> order = shuffle(0);
  std::string preempted;
  for (int64_t step = 0; step < total; ++step) {
    // Preemption (core/signals.h): between optimizer steps; the model so far is saved below.
    if (signals::stop_requested()) {
      preempted = str(signals::stop_signal_name(), " at step ", step, "/", total);
      break;
    }
    // An epoch's last batch may be partial: with few pairs (a warm start) every pair counts.
    if (cursor >= n) {
      order = shuffle(++epoch);
      cursor = 0;
    }
    std::vector<const SftExample*> batch;
    for (; cursor < n && static_cast<int64_t>(batch.size()) < options.batch_size; ++cursor)
      batch.push_back(&examples[static_cast<size_t>(order[static_cast<size_t>(cursor)])]);
    optimizer->use_train_weights();
    const SftBatchResult r = sft_backward(policy.model, batch, policy.pad_token_id, options.micro_batch_size);
    const double norm = clip_grad_norm(optimizer->params(), options.grad_clip);
    const double lr = options.lr * schedule.factor(optimizer->step_count());
    // A non-finite gradient would poison the weights; skip the update as the RL trainer does.
    if (std::isfinite(norm)) optimizer->step(lr);
    else log_warn(str("sft: step ", step + 1, ": non-finite gradient norm, update skipped"));
    optimizer->zero_grad();
    if (step == 0) result.first_loss = r.loss;
    result.last_loss = r.loss;
    logger.log(step + 1, {{"sft/loss", r.loss},
                          {"sft/lr", lr},
                          {"sft/grad_norm", norm},
                          {"sft/tokens", static_cast<double>(r.tokens)},
                          {"sft/epoch", static_cast<double>(epoch)}});
    if (bar) bar->advance(1, str("loss=", r.loss, " lr=", lr));
    result.steps = step + 1;
    if (options.stop_when && options.eval_every > 0 && result.steps >= options.min_steps &&
        result.steps % options.eval_every == 0) {
      optimizer->use_eval_weights();
      const bool stop = options.stop_when(policy, result.steps);
      optimizer->use_train_weights();
      if (stop) {
        result.stopped_early = result.steps < total;
        break;
      }
    }
  }
  if (bar) bar->finish();
  logger.flush(/*durable=*/true);

  optimizer->use_eval_weights();
  model::SaveOptions so;
  so.copy_files_from = model_dir;
  result.model_dir = out_dir / "model";
  policy.model.save_pretrained(result.model_dir, so);
  result.pairs = n;
  if (!preempted.empty())
    throw Preempted(str(preempted, ": the model so far saved to ", result.model_dir.string(),
                        " (sft does not resume: rerun to train all steps)"));
  log_info(str("sft: loss ", result.first_loss, " -> ", result.last_loss, "; model saved to ", result.model_dir.string()));
  return result;
}

}  // namespace rpg::train
