// UTF-8 and Unicode character classes for the tokenizer. Torch-free, ICU underneath.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rpg::tok {

inline constexpr char32_t kReplacement = 0xFFFD;

// Decodes the code point at s[i]. Returns its byte length, or 0 when the bytes at s[i] do
// not start a well-formed sequence; `bad_len` then receives the length of the maximal
// ill-formed subpart (the bytes one U+FFFD replaces, as Python and Rust's lossy decoders do).
size_t decode_utf8(std::string_view s, size_t i, char32_t& cp, size_t& bad_len);

void append_utf8(std::string& out, char32_t cp);

// Replaces every ill-formed subpart by U+FFFD. Returns true when s was already valid
// (then `out` is left untouched so the caller can keep using s).
bool sanitize_utf8(std::string_view s, std::string& out);

// Length of the longest prefix of s that ends on a character boundary such that the rest
// could still become valid UTF-8 when more bytes arrive. Used by streaming decode.
size_t utf8_stable_prefix(std::string_view s);

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

enum class NormalForm { kNFC, kNFD, kNFKC, kNFKD };
// Normalizes valid UTF-8 text. Returns false (and leaves `out` alone) when the text is
// already normalized, which is the common case and costs one quick-check pass.
bool normalize(NormalForm form, std::string_view s, std::string& out);

}  // namespace rpg::tok
