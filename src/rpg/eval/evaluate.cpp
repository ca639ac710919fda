#include "rpg/eval/evaluate.h"

#include <algorithm>
#include <memory>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/jsonl.h"

#include <nlohmann/json.hpp>
#include "rpg/core/progress.h"

namespace rpg::eval {

EvalResult evaluate(const rollout::Policy& policy, const std::vector<data::Row>& rows,
                    const rollout::SamplingParams& sampling_in, const rollout::EngineOptions& engine_options,
                    reward::RewardScorer& scorer, bool progress, bool chat_template,
                    const tok::ChatTemplateKwargs& chat_template_kwargs,
                    const std::optional<reward::OverlongConfig>& shaping) {
  for (const auto& r : rows) scorer.check_data_source(r.data_source);  // unknown data_source: fail before generating
  const rollout::SamplingParams sampling = rollout::with_stop_tokens(sampling_in, policy);

  std::vector<std::vector<int64_t>> prompts;
  prompts.reserve(rows.size());
  for (size_t i = 0; i < rows.size(); ++i) {
    std::vector<tok::ChatMessage> messages;
    for (const auto& m : rows[i].prompt) messages.push_back({m.role, m.content});
    try {
      prompts.push_back(rollout::render_prompt(policy.tokenizer, messages, chat_template, chat_template_kwargs));
    } catch (const Error& e) {  // the template is the model's; what it failed on is this row
      throw ValueError(str("row ", i, " of the data: rendering its prompt with the chat template failed: ", e.what()));
    }
  }
  rollout::RolloutEngine engine(policy.model, engine_options);
  engine.validate_request(prompts, sampling);
  std::unique_ptr<ProgressBar> bar;
  if (progress) bar = std::make_unique<ProgressBar>("eval", static_cast<int64_t>(rows.size()) * sampling.n, "seq");
  auto responses = engine.generate(prompts, sampling, [&](int64_t, int64_t) {
    if (bar) bar->advance(1);
  });
  if (bar) bar->finish();

  EvalResult out;
  out.stats = engine.last_stats();
  out.texts.reserve(responses.size());
  std::vector<reward::ScoreRequest> requests;
  for (const auto& r : responses) {
    std::vector<tok::TokenId> ids(r.token_ids.begin(), r.token_ids.end());
    out.texts.push_back(policy.tokenizer.decode(ids, /*skip_special_tokens=*/true));
  }
  std::vector<std::string> extra_info;
  for (const auto& row : rows) extra_info.push_back(data::extra_info_json(row.extra_info));
  for (size_t i = 0; i < responses.size(); ++i) {
    const size_t row = static_cast<size_t>(responses[i].prompt_index);
    requests.push_back({rows[row].data_source, out.texts[i], rows[row].reward_model.ground_truth, extra_info[row]});
  }
  auto scored = scorer.score(requests);
  out.reward_timeouts = scored.timeouts;
  const auto& scores = scored.results;
  for (size_t i = 0; i < responses.size(); ++i) {
    const auto& row = rows[static_cast<size_t>(responses[i].prompt_index)];
    ScoredResponse s;
    s.data_source = row.data_source;
    // The k repeats of one problem (extra_info.index 0..k-1) and their n samples form one group.
    s.problem = row.extra_info.raw_problem.empty() ? row.prompt.empty() ? "" : row.prompt.back().content
                                                   : row.extra_info.raw_problem;
    s.score = scores[i].score;
    s.acc = scores[i].acc;
    s.pred = scores[i].pred;
    if (shaping)
      s.reward = s.score + reward::overlong_penalty(*shaping, static_cast<int64_t>(responses[i].token_ids.size()));
    out.responses.push_back(std::move(s));
    out.ground_truths.push_back(row.reward_model.ground_truth);
    out.sources.push_back(responses[i].prompt_index);
  }
  out.metrics = compute_metrics(out.responses);
  return out;
}

void write_scored_responses(const std::filesystem::path& path, const EvalResult& result) {
  std::string text;
  for (size_t i = 0; i < result.responses.size(); ++i) {
    const ScoredResponse& s = result.responses[i];
    nlohmann::ordered_json j;
    j["data_source"] = s.data_source;
    j["row"] = i < result.sources.size() ? nlohmann::ordered_json(result.sources[i]) : nlohmann::ordered_json();
    j["problem"] = s.problem;
    j["ground_truth"] = i < result.ground_truths.size() ? result.ground_truths[i] : std::string();
    j["response"] = i < result.texts.size() ? result.texts[i] : std::string();
    j["score"] = s.score;
    j["acc"] = s.acc;
    j["pred"] = s.pred ? nlohmann::ordered_json(*s.pred) : nlohmann::ordered_json();
    text += j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  }
  write_file_atomic(path, text);
}

EvalResult evaluate_responses(const std::filesystem::path& path, reward::RewardScorer& scorer) {
  struct Line {
    std::string data_source, ground_truth, prompt, response;
  };
  std::vector<Line> lines;
  jsonl::for_each(path, [&](size_t number, nlohmann::json& j) {
    Line l;
    for (auto [key, field] : {std::pair{"data_source", &l.data_source}, std::pair{"ground_truth", &l.ground_truth},
                              std::pair{"prompt", &l.prompt}, std::pair{"response", &l.response}}) {
      if (!j.contains(key) || !j[key].is_string())
        throw FormatError(str(path.string(), ":", number, ": missing string field '", key, "'"));
      *field = j[key].get<std::string>();
    }
    lines.push_back(std::move(l));
  }, {.allow_torn_last_line = false});
  if (lines.empty()) throw FormatError(str(path.string(), ": no responses"));
  std::vector<reward::ScoreRequest> requests;
  for (const auto& l : lines) requests.push_back({l.data_source, l.response, l.ground_truth});
  auto scored = scorer.score(requests);
  const auto& scores = scored.results;
  EvalResult out;
  out.reward_timeouts = scored.timeouts;
  for (size_t i = 0; i < lines.size(); ++i) {
    ScoredResponse s;
    s.data_source = lines[i].data_source;
    s.problem = lines[i].prompt;
    s.score = scores[i].score;
    s.acc = scores[i].acc;
    s.pred = scores[i].pred;
    out.responses.push_back(std::move(s));
    out.texts.push_back(lines[i].response);
    out.ground_truths.push_back(lines[i].ground_truth);
    out.sources.push_back(static_cast<int64_t>(i));
  }
  out.metrics = compute_metrics(out.responses);
  return out;
}

std::string format_metrics(const MetricTable& metrics) {
  std::string out;
  for (const auto& [source, table] : metrics)
    for (const auto& [name, value] : table) out += str(source, "/", name, ": ", value, "\n");
  return out;
}

}  // namespace rpg::eval
