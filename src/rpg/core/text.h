// Small text utilities shared by modules that otherwise have nothing in common: the one
// UTF-8 codec of the project and the one HTML escaper.
#pragma once

#include <cstddef>
#include <type_traits>
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

// What for_each_codepoint makes of bytes that are not well-formed UTF-8.
enum class InvalidUtf8 {
  kReplace,  // one U+FFFD per maximal ill-formed subpart (Python's errors="replace")
  kEscape,   // one U+DC80..U+DCFF per byte (Python's errors="surrogateescape"): lossless
  kStop,     // stop the walk before it
};

struct CodePoint {
  char32_t cp;  // for ill-formed bytes their stand-in (see InvalidUtf8)
  size_t pos;   // byte offset in the string
  size_t len;   // bytes it spans
  bool valid;   // false: ill-formed bytes (a caller may pass s.substr(pos, len) through)
};

// The one code-point loop: calls f(const CodePoint&) for each code point of s in order;
// when f returns bool, false stops the walk. Returns the byte offset where the walk stopped
// (s.size() when it ran to the end).
template <class F>
size_t for_each_codepoint(std::string_view s, F&& f, InvalidUtf8 invalid = InvalidUtf8::kReplace) {
  size_t i = 0;
  while (i < s.size()) {
    CodePoint c{0, i, 0, true};
    size_t bad = 0;
    c.len = decode_utf8(s, i, c.cp, bad);
    if (c.len == 0) {
      if (invalid == InvalidUtf8::kStop) return i;
      c.valid = false;
      if (invalid == InvalidUtf8::kEscape) {
        c.cp = 0xDC00 + static_cast<unsigned char>(s[i]);
        c.len = 1;
      } else {
        c.cp = kReplacementChar;
        c.len = bad;
      }
    }
    if constexpr (std::is_same_v<std::invoke_result_t<F&, const CodePoint&>, bool>) {
      if (!f(c)) return i;
    } else {
      f(c);
    }
    i += c.len;
  }
  return i;
}

// The right-to-left walk, for rstrip-like scans: returns the smallest b in [begin, end]
// such that every code point of s[b, end) satisfies pred(char32_t). Ill-formed bytes stop
// the walk (they are never stripped), as kStop does for for_each_codepoint.
template <class Pred>
size_t rstrip_codepoints(std::string_view s, size_t begin, size_t end, Pred&& pred) {
  while (end > begin) {
    size_t k = end - 1;
    while (k > begin && is_utf8_continuation(static_cast<unsigned char>(s[k]))) --k;
    char32_t cp = 0;
    size_t bad = 0;
    if (decode_utf8(s, k, cp, bad) != end - k || !pred(cp)) break;
    end = k;
  }
  return end;
}

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

// A JSON parser's error (nlohmann's what()) with its "last read: '...'" excerpt cut to the
// last `keep` bytes (at a UTF-8 boundary): that excerpt is the whole token read so far, which
// for a file cut inside a long string (a chat template) is kilobytes of one error line.
std::string short_json_error(std::string_view what, size_t keep = 40);

}  // namespace rpg
