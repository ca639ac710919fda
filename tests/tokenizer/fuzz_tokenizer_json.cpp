// libFuzzer target: tokenizer.json / tokenizer_config.json loading. Any bytes must give a
// tokenizer or a FormatError; a loaded tokenizer must then encode without crashing.
// Input: tokenizer.json text, optionally followed by "\n@@config\n" and config text.
// Differential: the loader's fast tokenizer.json scanner and its full JSON parser
// (load.cpp) must give the same outcome, the same error message or the same tokenizer
// (vocabulary and encodings); a difference aborts.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/tokenizer/tokenizer.h"
#include "rpg/tokenizer/tokenizer_impl.h"

namespace {

std::string outcome(std::string_view tok_json, std::string_view cfg, bool full_only) {
  rpg::tok::tokenizer_detail::full_json_parse_only() = full_only;
  std::string out;
  try {
    auto tok = rpg::tok::Tokenizer::from_json(tok_json, "fuzz/tokenizer.json", cfg, "fuzz/tokenizer_config.json");
    auto ids = tok.encode("Hello world <|im_start|> 中文 😀 123456 \n\n  x", true);
    (void)tok.decode(ids);
    if (tok.has_chat_template()) (void)tok.apply_chat_template(nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}}), true);
    out = "ok " + std::to_string(tok.vocab_size());
    for (auto id : ids) out += " " + std::to_string(id);
    for (size_t id = 0; id < tok.vocab_size() && id < 4096; ++id) {
      try {
        std::string t = tok.id_to_token(static_cast<rpg::tok::TokenId>(id));
        auto back = tok.token_to_id(t);
        out += "\n" + t + " " + (back ? std::to_string(*back) : "-");
      } catch (const rpg::ValueError&) {
        out += "\n-";
      }
    }
  } catch (const rpg::Error& e) {
    out = std::string("error ") + e.what();
  }
  rpg::tok::tokenizer_detail::full_json_parse_only() = false;
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t cut = in.find("\n@@config\n");
  std::string_view tok_json = in.substr(0, cut);
  std::string_view cfg = cut == std::string_view::npos ? std::string_view() : in.substr(cut + 10);
  std::string fast = outcome(tok_json, cfg, false);
  std::string full = outcome(tok_json, cfg, true);
  if (fast != full) {
    std::fprintf(stderr, "fast and full tokenizer.json readers differ:\nfast: %.300s\nfull: %.300s\n", fast.c_str(),
                 full.c_str());
    std::abort();
  }
  return 0;
}
