#include "rpg/data/show.h"

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/data/dataset.h"

namespace rpg::data {
namespace {

std::string shorten(const std::string& s, int64_t max_chars) {
  if (max_chars <= 0 || static_cast<int64_t>(s.size()) <= max_chars) return s;
  size_t cut = static_cast<size_t>(max_chars);
  while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return s.substr(0, cut) + str("... (", s.size(), " bytes)");
}

}  // namespace

std::string show_dataset(const std::filesystem::path& path, int64_t n, int64_t max_chars) {
  ParquetInfo info = inspect_parquet(path);
  std::string out = str("file: ", path.string(), "\nrows: ", info.num_rows, " (", info.num_row_groups,
                        info.num_row_groups == 1 ? " row group" : " row groups", ")\nschema:\n");
  size_t start = 0;
  while (start < info.schema.size()) {
    size_t nl = info.schema.find('\n', start);
    if (nl == std::string::npos) nl = info.schema.size();
    out += "  " + info.schema.substr(start, nl - start) + "\n";
    start = nl + 1;
  }
  if (n <= 0) return out;
  auto rows = read_parquet(path);
  size_t shown = std::min(rows.size(), static_cast<size_t>(n));
  out += str("first ", shown, " rows:\n");
  for (size_t i = 0; i < shown; ++i) {
    const Row& r = rows[i];
    nlohmann::ordered_json prompt = nlohmann::ordered_json::array();
    for (const auto& m : r.prompt) prompt.push_back({{"role", m.role}, {"content", shorten(m.content, max_chars)}});
    nlohmann::ordered_json j = {
        {"data_source", r.data_source},
        {"prompt", prompt},
        {"ability", r.ability},
        {"reward_model", {{"ground_truth", shorten(r.reward_model.ground_truth, max_chars)}, {"style", r.reward_model.style}}},
        {"extra_info",
         {{"index", r.extra_info.index},
          {"raw_problem", shorten(r.extra_info.raw_problem, max_chars)},
          {"split", r.extra_info.split ? nlohmann::ordered_json(*r.extra_info.split) : nlohmann::ordered_json(nullptr)}}}};
    out += str("[", i, "] ", j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace), "\n");
  }
  return out;
}

}  // namespace rpg::data

namespace rpg::data {

std::string extra_info_json(const ExtraInfo& info) {
  nlohmann::ordered_json j{{"index", info.index}, {"raw_problem", info.raw_problem}};
  j["split"] = info.split ? nlohmann::ordered_json(*info.split) : nlohmann::ordered_json(nullptr);
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace rpg::data
