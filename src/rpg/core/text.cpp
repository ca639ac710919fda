#include "rpg/core/text.h"

namespace rpg {

size_t decode_utf8(std::string_view s, size_t i, char32_t& cp, size_t& bad_len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + i;
  size_t n = s.size() - i;
  unsigned char b0 = p[0];
  if (b0 < 0x80) {
    cp = b0;
    return 1;
  }
  // Well-formed byte sequences, Unicode Table 3-7: the second byte's range depends on the
  // first, which is what rules out overlongs and surrogates.
  size_t len;
  unsigned char lo = 0x80, hi = 0xBF;
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    len = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    len = 3;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    len = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    bad_len = 1;
    return 0;
  }
  char32_t v = b0 & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < len; ++k) {
    if (k >= n) {
      bad_len = k;
      return 0;
    }
    unsigned char b = p[k];
    unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      bad_len = k;
      return 0;
    }
    v = (v << 6) | (b & 0x3F);
  }
  cp = v;
  return len;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool sanitize_utf8(std::string_view s, std::string& out) {
  size_t i = 0;
  // Fast scan: most text is valid, and then no copy is made.
  while (i < s.size()) {
    char32_t cp;
    size_t bad;
    size_t len = decode_utf8(s, i, cp, bad);
    if (len == 0) break;
    i += len;
  }
  if (i == s.size()) return true;
  out.assign(s.substr(0, i));
  while (i < s.size()) {
    char32_t cp;
    size_t bad;
    size_t len = decode_utf8(s, i, cp, bad);
    if (len == 0) {
      append_utf8(out, kReplacementChar);
      i += bad;
    } else {
      out.append(s.substr(i, len));
      i += len;
    }
  }
  return false;
}

size_t utf8_stable_prefix(std::string_view s) {
  // Only the last three bytes can be the start of an incomplete character.
  size_t start = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = start; i < s.size(); ++i) {
    char32_t cp;
    size_t bad;
    auto lead = static_cast<unsigned char>(s[i]);
    if (lead >= 0xC2 && lead <= 0xF4 && decode_utf8(s, i, cp, bad) == 0 && i + bad == s.size()) {
      // Ill-formed only because the input ends here: more bytes may complete it.
      return i;
    }
  }
  return s.size();
}

std::string html_escape(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&#34;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string short_json_error(std::string_view what, size_t keep) {
  constexpr std::string_view kLastRead = "last read: '";
  const size_t start = what.find(kLastRead);
  if (start == std::string_view::npos) return std::string(what);
  const size_t from = start + kLastRead.size();
  size_t end = what.rfind("'; expected");
  if (end == std::string_view::npos || end < from) end = what.size() && what.back() == '\'' ? what.size() - 1 : what.size();
  if (end - from <= keep) return std::string(what);
  size_t cut = end - keep;
  while (cut < end && (static_cast<unsigned char>(what[cut]) & 0xC0) == 0x80) ++cut;  // not inside a code point
  return std::string(what.substr(0, from)) + "..." + std::string(what.substr(cut));
}

}  // namespace rpg
