// libFuzzer target for the `rpg data prepare` input parsers (CSV and JSON Lines). Checks: no
// crash / UB / leak, only FormatError for bad input, and CSV round trip: records written
// back as fully quoted CSV parse to the same records.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "rpg/core/error.h"
#include "rpg/data/prepare.h"

namespace {

std::string quote(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  try {
    auto recs = rpg::data::parse_csv_records(text, "fuzz.csv");
    std::string again = "problem,answer\n";
    for (const auto& r : recs) again += quote(r.problem) + "," + quote(r.answer) + "\r\n";
    auto back = rpg::data::parse_csv_records(again, "again.csv");
    if (back.size() != recs.size()) std::abort();
    for (size_t i = 0; i < recs.size(); ++i)
      if (back[i].problem != recs[i].problem || back[i].answer != recs[i].answer) std::abort();
    rpg::data::PrepareOptions opt;
    opt.repeat = 2;
    auto rows = rpg::data::prepare_rows(recs, opt);
    if (rows.size() != 2 * recs.size()) std::abort();
  } catch (const rpg::FormatError&) {
  }
  try {
    auto recs = rpg::data::parse_jsonl_records(text, "fuzz.jsonl");
    (void)recs;
  } catch (const rpg::FormatError&) {
  }
  return 0;
}
