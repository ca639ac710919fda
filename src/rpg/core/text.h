// Small text utilities shared by modules that otherwise have nothing in common: the one
// UTF-8 codec of the project and the one HTML escaper.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace rpg {

inline constexpr char32_t kReplacementChar = 0xFFFD;

inline bool is_utf8_continuation(unsigned char b) { return (b & 0xC0) == 0x80; }

// Decodes the code point at s[i]. Returns its byte length, or 0 when the bytes at s[i] do
// not start a well-formed sequence (Unicode Table 3-7: no overlongs, no surrogates, nothing
// above U+10FFFF); `bad_len` then receives the length of the maximal ill-formed subpart
// (the bytes one U+FFFD replaces, as Python's and Rust's lossy decoders do).
size_t decode_utf8(std::string_view s, size_t i, char32_t& cp, size_t& bad_len);

// Appends the UTF-8 form of cp (surrogates are written as their 3-byte form, as
// Python's "surrogatepass" would; callers that must not produce them do not pass them).
void append_utf8(std::string& out, char32_t cp);

// Replaces every ill-formed subpart by U+FFFD. Returns true when s was already valid
// (then `out` is left untouched so the caller can keep using s).
bool sanitize_utf8(std::string_view s, std::string& out);

// Length of the longest prefix of s that ends on a character boundary such that the rest
// could still become valid UTF-8 when more bytes arrive. Used by streaming decode.
size_t utf8_stable_prefix(std::string_view s);

// HTML/XML escaping with the entities Jinja2's `escape` filter (markupsafe) emits, so the
// chat-template engine and the HTML report produce the same text for the same input; safe
// both in element text and in quoted attribute values.
std::string html_escape(std::string_view s);

}  // namespace rpg
