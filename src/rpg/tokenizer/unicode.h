// Unicode for the tokenizer: Unicode normalization (ICU) here; the UTF-8 codec
// (core/text.h) and the character classes (core/unicode.h) live in core, shared with the
// chat-template engine, and are named here under rpg::tok for the tokenizer's code.
#pragma once

#include <string>
#include <string_view>

#include "rpg/core/text.h"
#include "rpg/core/unicode.h"

namespace rpg::tok {

inline constexpr char32_t kReplacement = kReplacementChar;
using rpg::append_utf8;
using rpg::decode_utf8;
using rpg::sanitize_utf8;
using rpg::utf8_stable_prefix;
using unicode::char_class;
using unicode::CharClass;
using unicode::is_letter;
using unicode::is_number;
using unicode::is_space;
using unicode::kLetter;
using unicode::kNumber;
using unicode::kOther;
using unicode::kSpace;
using unicode::to_lower;
using unicode::to_upper;

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
// Normalizes valid UTF-8 text. Returns false (and leaves `out` alone) when the text is
// already normalized, which is the common case and costs one quick-check pass.
bool normalize(NormalForm form, std::string_view s, std::string& out);

}  // namespace rpg::tok
