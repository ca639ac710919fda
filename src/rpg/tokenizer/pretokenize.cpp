#include "rpg/tokenizer/pretokenize.h"

#include "rpg/tokenizer/unicode.h"

namespace rpg::tok {

namespace {

constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The text decoded once: code points, their classes and byte offsets (one extra entry
// holding the end offset), reused across calls of one thread.
struct Decoded {
  std::vector<char32_t> cp;
  std::vector<uint8_t> cls;
  std::vector<uint32_t> off;
};

void decode_all(std::string_view text, Decoded& d) {
  d.cp.clear();
  d.cls.clear();
  d.off.clear();
  // Callers sanitize first; ill-formed bytes would still decode safely, as U+FFFD.
  for_each_codepoint(text, [&](const CodePoint& c) {
    d.cp.push_back(c.cp);
    d.cls.push_back(char_class(c.cp));
    d.off.push_back(static_cast<uint32_t>(c.pos));
  });
  d.off.push_back(static_cast<uint32_t>(text.size()));
}

// (?i:...) folds case, and Oniguruma's case folding maps U+017F LATIN SMALL LETTER LONG S
// to 's' as well.
inline char32_t fold(char32_t c) {
  if (c >= 'A' && c <= 'Z') return c + 32;
  if (c == 0x17F) return 's';
  return c;
}

inline bool is_nl(char32_t c) { return c == '\r' || c == '\n'; }

size_t contraction(const Decoded& d, size_t i, size_t n, bool ignore_case) {
  if (d.cp[i] != '\'' || i + 1 >= n) return 0;
  char32_t c1 = ignore_case ? fold(d.cp[i + 1]) : d.cp[i + 1];
  char32_t c2 = i + 2 < n ? (ignore_case ? fold(d.cp[i + 2]) : d.cp[i + 2]) : 0;
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  if ((c1 == 'r' || c1 == 'v') && c2 == 'e') return 3;
  if (c1 == 'l' && c2 == 'l') return 3;
  return 0;
}

// \s*[\r\n]+ | \s+(?!\S) | \s+ starting at a whitespace character.
size_t whitespace(const Decoded& d, size_t i, size_t n, bool newline_alt) {
  size_t j = i;
  while (j < n && (d.cls[j] & kSpace)) ++j;
  if (newline_alt) {
    // \s* backtracks to the last newline of the run, then [\r\n]+ takes it.
    for (size_t k = j; k > i; --k)
      if (is_nl(d.cp[k - 1])) return k - i;
  }
  if (j == n || j - i == 1) return j - i;
  return j - 1 - i;  // leave one space to join the next word
}

size_t match_llama_family(const Decoded& d, size_t i, size_t n, size_t max_digits) {
  const auto& cls = d.cls;
  if (size_t m = contraction(d, i, n, true)) return m;
  char32_t c = d.cp[i];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (!is_nl(c) && !(cls[i] & (kLetter | kNumber)) && i + 1 < n && (cls[i + 1] & kLetter)) {
    size_t j = i + 2;
    while (j < n && (cls[j] & kLetter)) ++j;
    return j - i;
  }
  if (cls[i] & kLetter) {
    size_t j = i + 1;
    while (j < n && (cls[j] & kLetter)) ++j;
    return j - i;
  }
  // \p{N}{1,max}
  if (cls[i] & kNumber) {
    size_t j = i + 1;
    while (j < n && j - i < max_digits && (cls[j] & kNumber)) ++j;
    return j - i;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t start = SIZE_MAX;
  if (c == ' ' && i + 1 < n && cls[i + 1] == kOther) start = i + 1;
  else if (cls[i] == kOther) start = i;
  if (start != SIZE_MAX) {
    size_t j = start + 1;
    while (j < n && cls[j] == kOther) ++j;
    while (j < n && is_nl(d.cp[j])) ++j;
    return j - i;
  }
  return whitespace(d, i, n, true);
}

size_t match_gpt2(const Decoded& d, size_t i, size_t n) {
  const auto& cls = d.cls;
  if (size_t m = contraction(d, i, n, false)) return m;
  size_t from = (d.cp[i] == ' ' && i + 1 < n) ? i + 1 : i;
  for (uint8_t want : {uint8_t(kLetter), uint8_t(kNumber), uint8_t(kOther)}) {
    auto ok = [&](size_t k) { return want == kOther ? cls[k] == kOther : (cls[k] & want) != 0; };
    size_t s = SIZE_MAX;
    if (from != i && ok(from)) s = from;
    else if (ok(i)) s = i;
    if (s != SIZE_MAX) {
      size_t j = s + 1;
      while (j < n && ok(j)) ++j;
      return j - i;
    }
  }
  return whitespace(d, i, n, false);
}

}  // namespace

std::optional<SplitPattern> split_pattern_from_regex(std::string_view regex) {
  if (regex == kQwen2Regex) return SplitPattern::kQwen2;
  if (regex == kLlama3Regex) return SplitPattern::kLlama3;
  if (regex == kGpt2Regex) return SplitPattern::kGpt2;
  return std::nullopt;
}

void split_pieces(SplitPattern pattern, std::string_view text,
                  std::vector<std::pair<uint32_t, uint32_t>>& out) {
  thread_local Decoded d;
  decode_all(text, d);
  size_t n = d.cp.size();
  size_t i = 0;
  while (i < n) {
    size_t m;
    switch (pattern) {
      case SplitPattern::kQwen2: m = match_llama_family(d, i, n, 1); break;
      case SplitPattern::kLlama3: m = match_llama_family(d, i, n, 3); break;
      default: m = match_gpt2(d, i, n); break;
    }
    if (m == 0) m = 1;  // unreachable: every class has an alternative
    out.emplace_back(d.off[i], d.off[i + m]);
    i += m;
  }
}

}  // namespace rpg::tok
