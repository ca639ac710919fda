// libFuzzer target: tokenizer.json / tokenizer_config.json loading. Any bytes must give a
// tokenizer or a FormatError; a loaded tokenizer must then encode without crashing.
// Input: tokenizer.json text, optionally followed by "\n@@config\n" and config text.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rpg/core/error.h"
#include "rpg/tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t cut = in.find("\n@@config\n");
  std::string_view tok_json = in.substr(0, cut);
  std::string_view cfg = cut == std::string_view::npos ? std::string_view() : in.substr(cut + 10);
  try {
    auto tok = rpg::tok::Tokenizer::from_json(tok_json, "fuzz/tokenizer.json", cfg, "fuzz/tokenizer_config.json");
    auto ids = tok.encode("Hello world <|im_start|> 中文 😀 123456 \n\n  x", true);
    (void)tok.decode(ids);
    if (tok.has_chat_template()) (void)tok.apply_chat_template(nlohmann::ordered_json::array({{{"role", "user"}, {"content", "hi"}}}), true);
  } catch (const rpg::Error&) {
  }
  return 0;
}
