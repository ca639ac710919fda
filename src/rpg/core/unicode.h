// Unicode character properties shared by the tokenizer's pre-tokenizer and the chat-template
// engine (Python's str methods). Torch-free, ICU underneath.
#pragma once

#include <cstdint>

namespace rpg::unicode {

// Unicode general categories used by the pre-tokenizer regexes: \p{L}, \p{N} and \s
// (the White_Space property, as Oniguruma's \s).
bool is_letter(char32_t cp);
bool is_number(char32_t cp);
bool is_space(char32_t cp);

// Flags of one code point, looked up together because the pre-tokenizer needs all three.
enum CharClass : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 4 };
uint8_t char_class(char32_t cp);

// Simple (one code point) case mappings.
char32_t to_upper(char32_t cp);
char32_t to_lower(char32_t cp);

}  // namespace rpg::unicode
