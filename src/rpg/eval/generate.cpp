#include "rpg/eval/generate.h"
#include "rpg/model/lora.h"

#include <iostream>
#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/log.h"
#include "rpg/core/progress.h"
#include "rpg/data/dataset.h"
#include "rpg/rollout/policy.h"

namespace rpg::eval {

GenerateSummary run_generate(const GenerateOptions& o) {
  o.sampling.validate();
  if (!o.output.empty() && o.output.extension() != ".jsonl")
    throw ValueError(str("--output ", o.output.string(), ": only .jsonl output is supported"));
  if (o.data.empty() && o.prompts.empty()) throw ValueError("nothing to generate: give --data FILE or --prompt TEXT");

  // Rows to prompt: the dataset's, or one user message per --prompt.
  std::vector<data::Row> rows;
  if (!o.data.empty()) {
    rows = data::read_prompt_rows(o.data, "--data");
    if (o.limit >= 0 && static_cast<int64_t>(rows.size()) > o.limit) rows.resize(static_cast<size_t>(o.limit));
  } else {
    for (const auto& p : o.prompts) {
      data::Row r;
      r.prompt = {{p, "user"}};
      rows.push_back(std::move(r));
    }
  }
  if (rows.empty()) throw ValueError(str(o.data.string(), ": no rows to generate for"));
  // Every response is held until the end (they are written in order): refuse a request
  // whose responses alone cannot fit, before the model is loaded. Per token: its id here
  // and in the engine, and its share of the JSON line; per response a fixed overhead.
  {
    const double responses = double(rows.size()) * double(o.sampling.n);
    const double bytes = responses * (double(o.sampling.max_new_tokens) * 48.0 + 1024.0);
    const int64_t avail = available_memory_bytes();
    if (avail > 0 && bytes > double(avail))
      throw ValueError(str("--n ", o.sampling.n, " x ", rows.size(), " prompt(s) x --max-new-tokens ",
                           o.sampling.max_new_tokens, ": the responses need up to ", format_bytes(bytes),
                           ", more than the ", format_bytes(double(avail)), " of memory available"));
  }

  rollout::Policy policy = rollout::load_policy(o.model_dir, o.dtype, o.device);
  if (!o.adapter.empty()) model::load_lora_adapter(policy.model, o.adapter);
  std::vector<std::vector<int64_t>> prompt_ids;
  std::vector<std::string> prompt_texts;
  for (const auto& r : rows) {
    std::vector<tok::ChatMessage> messages;
    for (const auto& m : r.prompt) messages.push_back({m.role, m.content});
    prompt_ids.push_back(rollout::render_prompt(policy.tokenizer, messages, o.chat_template, o.chat_template_kwargs));
    std::vector<tok::TokenId> ids(prompt_ids.back().begin(), prompt_ids.back().end());
    prompt_texts.push_back(policy.tokenizer.decode(ids));
  }

  const rollout::SamplingParams sampling = rollout::with_stop_tokens(o.sampling, policy);

  rollout::RolloutEngine engine(policy.model, o.engine);
  engine.validate_request(prompt_ids, sampling);
  const int64_t total = static_cast<int64_t>(rows.size()) * sampling.n;
  std::unique_ptr<ProgressBar> bar;
  if (o.progress) bar = std::make_unique<ProgressBar>("generate", total, "seq");
  auto responses = engine.generate(prompt_ids, sampling, [&](int64_t, int64_t) {
    if (bar) bar->advance(1);
  });
  if (bar) bar->finish();

  std::string jsonl;
  for (const auto& r : responses) {
    const auto& row = rows[static_cast<size_t>(r.prompt_index)];
    std::vector<tok::TokenId> ids(r.token_ids.begin(), r.token_ids.end());
    nlohmann::ordered_json j;
    j["prompt_index"] = r.prompt_index;
    j["sample_index"] = r.sample_index;
    j["data_source"] = row.data_source;
    j["ground_truth"] = row.reward_model.ground_truth;
    j["prompt"] = prompt_texts[static_cast<size_t>(r.prompt_index)];
    j["response"] = policy.tokenizer.decode(ids, /*skip_special_tokens=*/true);
    j["response_ids"] = r.token_ids;
    j["finish_reason"] = rollout::finish_reason_name(r.finish_reason);
    jsonl += j.dump(-1, ' ', /*ensure_ascii=*/false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  if (o.output.empty()) std::cout << jsonl;
  else write_file_atomic(o.output, jsonl);

  GenerateSummary s;
  s.prompts = static_cast<int64_t>(rows.size());
  s.responses = static_cast<int64_t>(responses.size());
  s.stats = engine.last_stats();
  return s;
}

}  // namespace rpg::eval
