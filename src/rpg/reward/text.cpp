#include "rpg/reward/text.h"

#include <algorithm>
#include <iterator>

#include "rpg/core/text.h"

namespace rpg::reward::text {
namespace {

void decode_into(std::string_view s, size_t from, std::u32string& out) {
  for_each_codepoint(s.substr(from), [&](const CodePoint& c) { out.push_back(c.cp); }, InvalidUtf8::kEscape);
}

// Python 3.11 (Unicode 14.0) code points for which str.isdigit() is true.
constexpr char32_t kDigitRanges[][2] = {
    {0x30, 0x39}, {0xB2, 0xB3}, {0xB9, 0xB9}, {0x660, 0x669}, {0x6F0, 0x6F9}, {0x7C0, 0x7C9},
    {0x966, 0x96F}, {0x9E6, 0x9EF}, {0xA66, 0xA6F}, {0xAE6, 0xAEF}, {0xB66, 0xB6F}, {0xBE6, 0xBEF},
    {0xC66, 0xC6F}, {0xCE6, 0xCEF}, {0xD66, 0xD6F}, {0xDE6, 0xDEF}, {0xE50, 0xE59}, {0xED0, 0xED9},
    {0xF20, 0xF29}, {0x1040, 0x1049}, {0x1090, 0x1099}, {0x1369, 0x1371}, {0x17E0, 0x17E9},
    {0x1810, 0x1819}, {0x1946, 0x194F}, {0x19D0, 0x19DA}, {0x1A80, 0x1A89}, {0x1A90, 0x1A99},
    {0x1B50, 0x1B59}, {0x1BB0, 0x1BB9}, {0x1C40, 0x1C49}, {0x1C50, 0x1C59}, {0x2070, 0x2070},
    {0x2074, 0x2079}, {0x2080, 0x2089}, {0x2460, 0x2468}, {0x2474, 0x247C}, {0x2488, 0x2490},
    {0x24EA, 0x24EA}, {0x24F5, 0x24FD}, {0x24FF, 0x24FF}, {0x2776, 0x277E}, {0x2780, 0x2788},
    {0x278A, 0x2792}, {0xA620, 0xA629}, {0xA8D0, 0xA8D9}, {0xA900, 0xA909}, {0xA9D0, 0xA9D9},
    {0xA9F0, 0xA9F9}, {0xAA50, 0xAA59}, {0xABF0, 0xABF9}, {0xFF10, 0xFF19}, {0x104A0, 0x104A9},
    {0x10A40, 0x10A43}, {0x10D30, 0x10D39}, {0x10E60, 0x10E68}, {0x11052, 0x1105A},
    {0x11066, 0x1106F}, {0x110F0, 0x110F9}, {0x11136, 0x1113F}, {0x111D0, 0x111D9},
    {0x112F0, 0x112F9}, {0x11450, 0x11459}, {0x114D0, 0x114D9}, {0x11650, 0x11659},
    {0x116C0, 0x116C9}, {0x11730, 0x11739}, {0x118E0, 0x118E9}, {0x11950, 0x11959},
    {0x11C50, 0x11C59}, {0x11D50, 0x11D59}, {0x11DA0, 0x11DA9}, {0x16A60, 0x16A69},
    {0x16AC0, 0x16AC9}, {0x16B50, 0x16B59}, {0x1D7CE, 0x1D7FF}, {0x1E140, 0x1E149},
    {0x1E2F0, 0x1E2F9}, {0x1E950, 0x1E959}, {0x1F100, 0x1F10A}, {0x1FBF0, 0x1FBF9},
};

}  // namespace

std::u32string decode(std::string_view bytes) {
  std::u32string out;
  out.reserve(bytes.size());
  decode_into(bytes, 0, out);
  return out;
}

std::u32string decode_last(std::string_view bytes, size_t n) {
  // Every byte that is not a continuation byte starts a code point, so decoding can begin
  // at the first such byte near the end; fall back to a full decode when that is too few.
  size_t budget = 4 * n + 4;
  if (bytes.size() > budget) {
    size_t p = bytes.size() - budget;
    while (p < bytes.size() && is_utf8_continuation(static_cast<unsigned char>(bytes[p]))) ++p;
    std::u32string tail;
    decode_into(bytes, p, tail);
    if (tail.size() >= n) return tail.substr(tail.size() - n);
  }
  std::u32string all = decode(bytes);
  return all.size() > n ? all.substr(all.size() - n) : all;
}

std::string encode(std::u32string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char32_t c : s) {
    if (c >= 0xDC80 && c <= 0xDCFF) out.push_back(static_cast<char>(c - 0xDC00));
    else append_utf8(out, c);
  }
  return out;
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

bool is_digit(char32_t c) {
  auto it = std::upper_bound(std::begin(kDigitRanges), std::end(kDigitRanges), c,
                             [](char32_t v, const char32_t(&r)[2]) { return v < r[0]; });
  if (it == std::begin(kDigitRanges)) return false;
  --it;
  return c <= (*it)[1];
}

std::u32string replace_all(std::u32string_view s, std::u32string_view from, std::u32string_view to) {
  std::u32string out;
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(from, pos);
    if (hit == std::u32string_view::npos) break;
    out.append(s.substr(pos, hit - pos));
    out.append(to);
    pos = hit + from.size();
  }
  out.append(s.substr(pos));
  return out;
}

std::vector<std::u32string> split(std::u32string_view s, std::u32string_view sep) {
  std::vector<std::u32string> parts;
  size_t pos = 0;
  while (true) {
    size_t hit = s.find(sep, pos);
    if (hit == std::u32string_view::npos) break;
    parts.emplace_back(s.substr(pos, hit - pos));
    pos = hit + sep.size();
  }
  parts.emplace_back(s.substr(pos));
  return parts;
}

std::u32string strip(std::u32string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && is_space(s[b])) ++b;
  while (e > b && is_space(s[e - 1])) --e;
  return std::u32string(s.substr(b, e - b));
}

bool isdigit(std::u32string_view s) {
  if (s.empty()) return false;
  for (char32_t c : s)
    if (!is_digit(c)) return false;
  return true;
}

bool contains(std::u32string_view s, std::u32string_view needle) { return s.find(needle) != std::u32string_view::npos; }

}  // namespace rpg::reward::text
