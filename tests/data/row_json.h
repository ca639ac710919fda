// Rows <-> the JSON shape pyarrow's Table.to_pylist() gives (for the oracle exchanges).
#pragma once

#include <nlohmann/json.hpp>
#include <vector>

#include "rpg/data/dataset.h"

namespace rpg::test {

inline nlohmann::json row_to_json(const data::Row& r) {
  nlohmann::json prompt = nlohmann::json::array();
  for (const auto& m : r.prompt) prompt.push_back({{"content", m.content}, {"role", m.role}});
  return {{"data_source", r.data_source},
          {"prompt", prompt},
          {"ability", r.ability},
          {"reward_model", {{"ground_truth", r.reward_model.ground_truth}, {"style", r.reward_model.style}}},
          {"extra_info",
           {{"index", r.extra_info.index},
            {"raw_problem", r.extra_info.raw_problem},
            {"split", r.extra_info.split ? nlohmann::json(*r.extra_info.split) : nlohmann::json(nullptr)}}}};
}

inline data::Row row_from_json(const nlohmann::json& j) {
  data::Row r;
  r.data_source = j.at("data_source");
  for (const auto& m : j.at("prompt")) r.prompt.push_back({m.at("content"), m.at("role")});
  r.ability = j.at("ability");
  r.reward_model = {j.at("reward_model").at("ground_truth"), j.at("reward_model").at("style")};
  const auto& e = j.at("extra_info");
  r.extra_info.index = e.at("index");
  r.extra_info.raw_problem = e.at("raw_problem");
  if (!e.at("split").is_null()) r.extra_info.split = e.at("split").get<std::string>();
  return r;
}

}  // namespace rpg::test
