#include "rpg/core/jsonl.h"

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/core/io.h"

namespace fs = std::filesystem;

namespace rpg::jsonl {
namespace {

// Splits at '\n' without copying; a final line without '\n' is still a line.
template <class Fn>
void for_each_line(std::string_view text, Fn&& fn) {
  size_t start = 0, number = 0;
  while (start < text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(start, end - start);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    fn(++number, line, end >= text.size() - 1);
    start = end + 1;
  }
}

}  // namespace

void parse(std::string_view text, std::string_view source, const LineFn& fn, const ReadOptions& options) {
  for_each_line(text, [&](size_t number, std::string_view line, bool last) {
    if (line.find_first_not_of(" \t") == std::string_view::npos) return;
    auto value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool bad = value.is_discarded() || (options.objects_only && !value.is_object());
    if (bad) {
      if (last && options.allow_torn_last_line) return;
      throw FormatError(str(source, ":", number, ": ",
                            value.is_discarded() ? std::string("not valid JSON")
                                                 : str("expected a JSON object, got ", value.type_name())));
    }
    fn(number, value);
  });
}

void for_each(const fs::path& path, const LineFn& fn, const ReadOptions& options) {
  parse(read_file(path), path.string(), fn, options);
}

std::vector<nlohmann::json> read(const fs::path& path, const ReadOptions& options) {
  std::vector<nlohmann::json> out;
  for_each(path, [&](size_t, nlohmann::json& v) { out.push_back(std::move(v)); }, options);
  return out;
}

void keep_steps(const fs::path& path, const std::function<bool(int64_t)>& keep) {
  if (!fs::exists(path)) return;
  const std::string text = read_file(path);
  std::string kept;
  for_each_line(text, [&](size_t, std::string_view line, bool) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && keep(j["step"].get<int64_t>())) {
      kept.append(line);
      kept += '\n';
    }
  });
  write_file_atomic(path, kept);
}

}  // namespace rpg::jsonl
