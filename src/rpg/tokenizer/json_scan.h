// tokenizer.json's syntax, read for load.cpp (which knows its schema): model.vocab and
// model.merges (~150k entries each) are streamed into flat vectors, never a JSON tree; the rest
// of the file becomes an ordinary nlohmann DOM.
#pragma once

#include <cstdint>
#include <deque>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace rpg::tok::tokenizer_detail {

// model.vocab and model.merges as read from tokenizer.json, before they are checked against
// each other. The strings are views of the JSON text where they had no escapes, else of
// `owned`.
struct StreamedModel {
  struct Entry {
    std::string_view token;
    int64_t id;
  };
  struct Merge {
    std::string_view a, b;
    bool from_string;  // "a b" (else ["a", "b"]), for error messages
  };
  std::deque<std::string> owned;
  std::vector<Entry> vocab;
  std::vector<Merge> merges;
  bool have_vocab = false, have_merges = false;
  std::string_view own(std::string s) { return owned.emplace_back(std::move(s)); }
};

// tokenizer.json as a DOM with root.model.vocab / root.model.merges left null, those two read
// into `streamed`. The fast scanner runs first (unless full_json_parse_only()); whatever it
// does not handle is read again by the full SAX parser, whose FormatError (naming `origin`)
// rejects the file. Both give the same result on what both accept.
nlohmann::json scan_tokenizer_json(std::string_view text, const std::string& origin, StreamedModel& streamed);

}  // namespace rpg::tok::tokenizer_detail
