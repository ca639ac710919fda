#include "rpg/tokenizer/unicode.h"

#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <array>
#include <memory>
#include <mutex>
#include <vector>

#include "rpg/core/error.h"

namespace rpg::tok {

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
      append_utf8(out, kReplacement);
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

namespace {

// Classes of the Basic Multilingual Plane, built once from ICU so the hot path is one
// table load; supplementary planes ask ICU directly.
struct BmpTable {
  std::array<uint8_t, 0x10000> cls{};
  BmpTable() {
    for (char32_t c = 0; c < 0x10000; ++c) cls[c] = classify(c);
  }
  static uint8_t classify(char32_t c) {
    uint8_t f = kOther;
    int8_t t = u_charType(static_cast<UChar32>(c));
    switch (t) {
      case U_UPPERCASE_LETTER:
      case U_LOWERCASE_LETTER:
      case U_TITLECASE_LETTER:
      case U_MODIFIER_LETTER:
      case U_OTHER_LETTER:
        f |= kLetter;
        break;
      case U_DECIMAL_DIGIT_NUMBER:
      case U_LETTER_NUMBER:
      case U_OTHER_NUMBER:
        f |= kNumber;
        break;
      default:
        break;
    }
    if (u_isUWhiteSpace(static_cast<UChar32>(c))) f |= kSpace;
    return f;
  }
};

const BmpTable& bmp() {
  static const BmpTable table;
  return table;
}

}  // namespace

uint8_t char_class(char32_t cp) {
  if (cp < 0x10000) return bmp().cls[cp];
  return BmpTable::classify(cp);
}
bool is_letter(char32_t cp) { return char_class(cp) & kLetter; }
bool is_number(char32_t cp) { return char_class(cp) & kNumber; }
bool is_space(char32_t cp) { return char_class(cp) & kSpace; }

char32_t to_upper(char32_t cp) {
  if (cp < 0x80) return (cp >= 'a' && cp <= 'z') ? cp - 32 : cp;
  return static_cast<char32_t>(u_toupper(static_cast<UChar32>(cp)));
}
char32_t to_lower(char32_t cp) {
  if (cp < 0x80) return (cp >= 'A' && cp <= 'Z') ? cp + 32 : cp;
  return static_cast<char32_t>(u_tolower(static_cast<UChar32>(cp)));
}

bool normalize(NormalForm form, std::string_view s, std::string& out) {
  bool ascii = true;
  for (unsigned char c : s) {
    if (c >= 0x80) {
      ascii = false;
      break;
    }
  }
  if (ascii) return false;  // ASCII is invariant under all four forms
  UErrorCode err = U_ZERO_ERROR;
  const UNormalizer2* norm = nullptr;
  switch (form) {
    case NormalForm::kNFC: norm = unorm2_getNFCInstance(&err); break;
    case NormalForm::kNFD: norm = unorm2_getNFDInstance(&err); break;
    case NormalForm::kNFKC: norm = unorm2_getNFKCInstance(&err); break;
    case NormalForm::kNFKD: norm = unorm2_getNFKDInstance(&err); break;
  }
  if (U_FAILURE(err)) throw Error(str("ICU normalizer unavailable: ", u_errorName(err)));
  // ICU works in UTF-16.
  std::vector<UChar> u16(s.size() + 1);
  int32_t u16_len = 0;
  u_strFromUTF8(u16.data(), static_cast<int32_t>(u16.size()), &u16_len, s.data(),
                static_cast<int32_t>(s.size()), &err);
  if (U_FAILURE(err)) throw Error(str("UTF-8 to UTF-16 failed: ", u_errorName(err)));
  if (unorm2_isNormalized(norm, u16.data(), u16_len, &err) && U_SUCCESS(err)) return false;
  err = U_ZERO_ERROR;
  int32_t cap = u16_len * 3 + 16;
  std::vector<UChar> dst(static_cast<size_t>(cap));
  int32_t dst_len = unorm2_normalize(norm, u16.data(), u16_len, dst.data(), cap, &err);
  if (err == U_BUFFER_OVERFLOW_ERROR) {
    err = U_ZERO_ERROR;
    dst.resize(static_cast<size_t>(dst_len));
    dst_len = unorm2_normalize(norm, u16.data(), u16_len, dst.data(), dst_len, &err);
  }
  if (U_FAILURE(err)) throw Error(str("normalization failed: ", u_errorName(err)));
  out.assign(static_cast<size_t>(dst_len) * 3 + 4, '\0');
  int32_t out_len = 0;
  u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &out_len, dst.data(), dst_len, &err);
  if (U_FAILURE(err)) throw Error(str("UTF-16 to UTF-8 failed: ", u_errorName(err)));
  out.resize(static_cast<size_t>(out_len));
  return true;
}

}  // namespace rpg::tok
