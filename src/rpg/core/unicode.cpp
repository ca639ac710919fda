#include "rpg/core/unicode.h"

#include <unicode/uchar.h>

#include <array>

namespace rpg::unicode {

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

}  // namespace rpg::unicode
