// libFuzzer target for the answer extractors and normalisers: the input is
// "response \0 ground_truth". Checks: no crash / UB / leak, scores in their ranges, pred
// consistent with acc, and the lossless UTF-8 round trip.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "rpg/reward/math_dapo.h"
#include "rpg/reward/math_lighteval.h"
#include "rpg/reward/text.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  size_t cut = in.find('\0');
  std::string_view response = in.substr(0, cut);
  std::string_view gt = cut == std::string_view::npos ? std::string_view("42") : in.substr(cut + 1);

  if (rpg::reward::text::encode(rpg::reward::text::decode(in)) != in) std::abort();
  for (bool strict : {false, true}) {
    auto r = rpg::reward::dapo_score(response, gt, strict);
    if (r.score != (r.acc ? 1.0 : -1.0)) std::abort();
    if (strict && r.acc && r.pred != std::string(gt)) std::abort();
    if (!strict && !r.pred) std::abort();
  }
  auto l = rpg::reward::lighteval_score(response, gt);
  if (l.score != (l.acc ? 1.0 : 0.0) || (l.acc && !l.pred)) std::abort();
  (void)rpg::reward::dapo_normalize(response);
  (void)rpg::reward::dapo_extract_answer(response);
  (void)rpg::reward::lighteval_strip_string(response);
  (void)rpg::reward::lighteval_is_equiv(response, gt);
  return 0;
}
