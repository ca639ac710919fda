#include "rpg/core/jsonl.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "rpg/core/error.h"
#include "rpg/core/io.h"

namespace fs = std::filesystem;

namespace rpg::jsonl {
namespace {

// Calls fn(number, line, last) for every line next(line) yields, numbered from 1, with a
// trailing '\r' removed; `last` marks the final line, whether it ends in '\n' or was torn.
template <class Next, class Fn>
void for_each_line(Next&& next, Fn&& fn) {
  std::string line, following;
  size_t number = 0;
  for (bool have = next(line); have;) {
    const bool more = next(following);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    fn(++number, std::string_view(line), !more);
    line.swap(following);
    have = more;
  }
}

// The lines of an in-memory text (a final line without '\n' is still a line).
auto text_lines(std::string_view text) {
  return [text, start = size_t{0}](std::string& line) mutable {
    if (start >= text.size()) return false;
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    line.assign(text.substr(start, end - start));
    start = end + 1;
    return true;
  };
}

// The lines of a file, read a buffer at a time: a long run's metrics.jsonl is read at every
// checkpoint (the report), so readers must not hold the whole file.
template <class Fn>
void file_lines(const fs::path& path, Fn&& fn) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw IoError(str("cannot open ", path.string(), ": ", std::strerror(errno)));
  for_each_line([&](std::string& line) { return static_cast<bool>(std::getline(in, line)); }, fn);
  if (in.bad()) throw IoError(str("cannot read ", path.string()));
}

void parse_line(size_t number, std::string_view line, bool last, std::string_view source, const LineFn& fn,
                const ReadOptions& options) {
  if (line.find_first_not_of(" \t") == std::string_view::npos) return;
  if (line.size() > options.max_line_bytes)
    throw FormatError(str(source, ":", number, ": a line of ", line.size(), " bytes is over the ",
                          options.max_line_bytes >> 20, " MiB budget of one JSON line"));
  auto value = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  const bool bad = value.is_discarded() || (options.objects_only && !value.is_object());
  if (bad) {
    if (last && options.allow_torn_last_line) return;
    throw FormatError(str(source, ":", number, ": ",
                          value.is_discarded() ? std::string("not valid JSON")
                                               : str("expected a JSON object, got ", value.type_name())));
  }
  fn(number, value);
}

}  // namespace

void parse(std::string_view text, std::string_view source, const LineFn& fn, const ReadOptions& options) {
  for_each_line(text_lines(text), [&](size_t number, std::string_view line, bool last) {
    parse_line(number, line, last, source, fn, options);
  });
}

void for_each(const fs::path& path, const LineFn& fn, const ReadOptions& options) {
  const std::string source = path.string();
  file_lines(path, [&](size_t number, std::string_view line, bool last) { parse_line(number, line, last, source, fn, options); });
}

std::vector<nlohmann::json> read(const fs::path& path, const ReadOptions& options) {
  std::vector<nlohmann::json> out;
  for_each(path, [&](size_t, nlohmann::json& v) { out.push_back(std::move(v)); }, options);
  return out;
}

void keep_steps(const fs::path& path, const std::function<bool(int64_t)>& keep) {
  if (!fs::exists(path)) return;
  std::string kept;
  file_lines(path, [&](size_t, std::string_view line, bool) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("step") && j["step"].is_number_integer() && keep(j["step"].get<int64_t>())) {
      kept.append(line);
      kept += '\n';
    }
  });
  write_file_atomic(path, kept);
}

}  // namespace rpg::jsonl
