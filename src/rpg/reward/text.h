// Python-string semantics over UTF-8 bytes, for scorers that must agree with Python code
// character for character (verl's math_dapo and math_reward work on `str`, i.e. code
// points). Text is decoded to a u32string of code points; a byte that is not part of a
// well-formed UTF-8 sequence becomes one code point 0xDC00 + byte (Python's
// "surrogateescape"), so decoding never fails and encode(decode(b)) == b for any bytes.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rpg::reward::text {

// Bytes -> code points (lossless, see above).
std::u32string decode(std::string_view bytes);
// Code points -> bytes; 0xDC80..0xDCFF go back to the single byte they came from.
std::string encode(std::u32string_view s);
// Decodes only the last `n` code points of `bytes` (Python's s[-n:]).
std::u32string decode_last(std::string_view bytes, size_t n);

// Python's str.isspace() for one code point (also what `\s` matches in a str regex).
bool is_space(char32_t c);
// Python's str.isdigit() for one code point (Unicode Numeric_Type Digit or Decimal, UCD 14).
bool is_digit(char32_t c);

// Python str methods.
std::u32string replace_all(std::u32string_view s, std::u32string_view from, std::u32string_view to);
std::vector<std::u32string> split(std::u32string_view s, std::u32string_view sep);  // sep non-empty
std::u32string strip(std::u32string_view s);
bool isdigit(std::u32string_view s);  // false when empty
bool contains(std::u32string_view s, std::u32string_view needle);

}  // namespace rpg::reward::text
