// dp::reward_scorer: rank 0 scores, every rank gets the same RewardScores.
#include <cmath>
#include <exception>
#include <limits>
#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/dist/data_parallel.h"
#include "rpg/dist/world.h"
#include "rpg/train/dp.h"

namespace rpg::train::dp {
namespace {

using Json = nlohmann::json;

// JSON keeps every double exactly (17 significant digits); NaN (an extra key a response
// lacks) has no JSON spelling and travels as null.
Json encode(const reward::RewardScores& s) {
  Json score = Json::array(), acc = Json::array(), pred = Json::array(), extra = Json::object();
  for (const auto& r : s.results) {
    score.push_back(r.score);
    acc.push_back(r.acc);
    pred.push_back(r.pred ? Json(*r.pred) : Json(nullptr));
  }
  for (const auto& [key, values] : s.extra) {
    Json v = Json::array();
    for (double x : values) v.push_back(std::isnan(x) ? Json(nullptr) : Json(x));
    extra[key] = std::move(v);
  }
  return {{"score", score}, {"acc", acc}, {"pred", pred}, {"extra", extra}, {"timeouts", s.timeouts}};
}

reward::RewardScores decode(const Json& j) {
  reward::RewardScores s;
  const auto& score = j.at("score");
  for (size_t i = 0; i < score.size(); ++i) {
    reward::ScoreResult r;
    r.score = score[i].get<double>();
    r.acc = j.at("acc")[i].get<bool>();
    if (!j.at("pred")[i].is_null()) r.pred = j.at("pred")[i].get<std::string>();
    s.results.push_back(std::move(r));
  }
  for (const auto& [key, values] : j.at("extra").items())
    for (const auto& x : values)
      s.extra[key].push_back(x.is_null() ? std::numeric_limits<double>::quiet_NaN() : x.get<double>());
  s.timeouts = j.at("timeouts").get<int64_t>();
  return s;
}

class RankZeroScorer final : public reward::RewardScorer {
 public:
  RankZeroScorer(std::unique_ptr<reward::RewardScorer> inner, dist::ProcessGroup& pg)
      : inner_(std::move(inner)), pg_(pg) {}

  void check_data_source(std::string_view data_source) const override {
    if (inner_) inner_->check_data_source(data_source);
  }
  std::string describe() const override { return inner_ ? inner_->describe() : "rank 0's reward scorer"; }

  reward::RewardScores score(std::span<const reward::ScoreRequest> requests) override {
    std::exception_ptr failure;
    std::vector<std::vector<int64_t>> mine;
    if (inner_) {
      std::string text;
      try {
        text = encode(inner_->score(requests)).dump();
      } catch (const std::exception& e) {
        // The other ranks stop with rank 0's line instead of waiting in the next collective.
        failure = std::current_exception();
        text = Json{{"error", e.what()}}.dump(-1, ' ', false, Json::error_handler_t::replace);
      }
      mine.emplace_back(text.begin(), text.end());
    }
    const auto all = dist::all_gather_sequences(pg_, mine);
    if (failure) std::rethrow_exception(failure);
    if (all.size() != 1) throw ValueError(str("reward scorer: expected rank 0's scores, got ", all.size(), " payloads"));
    const std::string text(all[0].begin(), all[0].end());
    const Json j = Json::parse(text);
    if (j.contains("error")) throw ValueError(j["error"].get<std::string>());
    reward::RewardScores out = decode(j);
    if (out.results.size() != requests.size())
      throw ValueError(str("reward scorer: rank 0 scored ", out.results.size(), " responses, expected ", requests.size()));
    return out;
  }

 private:
  std::unique_ptr<reward::RewardScorer> inner_;
  dist::ProcessGroup& pg_;
};

}  // namespace

std::unique_ptr<reward::RewardScorer> reward_scorer(
    bool calls_out, const std::function<std::unique_ptr<reward::RewardScorer>()>& make) {
  dist::ProcessGroup* pg = dist::world();
  if (!calls_out || !pg || pg->size() == 1) return make();
  return std::make_unique<RankZeroScorer>(pg->rank() == 0 ? make() : nullptr, *pg);
}

}  // namespace rpg::train::dp
