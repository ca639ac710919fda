#include "rpg/tokenizer/unicode.h"

#include <unicode/unorm2.h>
#include <unicode/ustring.h>

#include <vector>

#include "rpg/core/error.h"

namespace rpg::tok {

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
