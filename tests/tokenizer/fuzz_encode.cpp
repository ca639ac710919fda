// libFuzzer target: encode must accept any bytes and keep its invariants. The first byte
// picks the pre-tokenizer (Qwen2, Llama 3, GPT-2) and whether special tokens are added.
// Without a normalizer, decode(encode(s)) must give back s with invalid UTF-8 replaced,
// and streaming decode must equal decode; any violation aborts.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "rpg/core/error.h"
#include "rpg/tokenizer/tokenizer.h"
#include "rpg/tokenizer/unicode.h"
#include "tiny_tokenizer.h"

namespace {
const rpg::tok::Tokenizer& tokenizer(int which) {
  static const rpg::tok::Tokenizer toks[3] = {
      rpg::tok::Tokenizer::from_json(rpg::test::tiny_tokenizer_json(rpg::test::kQwen2Regex, false).dump(), "qwen2"),
      rpg::tok::Tokenizer::from_json(rpg::test::tiny_tokenizer_json(rpg::test::kLlama3Regex, false).dump(), "llama3"),
      rpg::tok::Tokenizer::from_json(rpg::test::tiny_tokenizer_json("", false).dump(), "gpt2")};
  return toks[which];
}
const rpg::tok::Tokenizer& nfc_tokenizer() {
  static const rpg::tok::Tokenizer tok =
      rpg::tok::Tokenizer::from_json(rpg::test::tiny_tokenizer_json(rpg::test::kQwen2Regex, true).dump(), "qwen2-nfc");
  return tok;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  int which = data[0] % 3;
  bool special = (data[0] / 3) % 2;
  std::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const rpg::tok::Tokenizer& tok = tokenizer(which);
  auto ids = tok.encode(text, special);
  std::string clean;
  std::string expect = rpg::tok::sanitize_utf8(text, clean) ? std::string(text) : clean;
  if (tok.decode(ids) != expect) abort();
  auto stream = tok.stream_decoder();
  std::string streamed;
  for (auto id : ids) {
    std::string piece = stream.push(id);
    std::string fixed;
    if (!rpg::tok::sanitize_utf8(piece, fixed)) abort();
    streamed += piece;
  }
  streamed += stream.finish();
  if (streamed != expect) abort();
  // The NFC path may change the text but must not crash and must decode to valid UTF-8.
  std::string nfc = nfc_tokenizer().decode(nfc_tokenizer().encode(text));
  std::string fixed;
  if (!rpg::tok::sanitize_utf8(nfc, fixed)) abort();
  return 0;
}
