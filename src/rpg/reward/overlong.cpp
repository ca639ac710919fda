#include "rpg/reward/overlong.h"

#include <algorithm>

#include "rpg/core/error.h"

namespace rpg::reward {

void validate(const OverlongConfig& c) {
  if (!c.enable) return;
  if (c.len <= 0) throw ValueError(str("overlong_buffer.len: got ", c.len, ", expected > 0"));
  if (c.max_response_length < c.len)
    throw ValueError(str("overlong_buffer: max_response_length ", c.max_response_length,
                         " must be >= overlong_buffer.len ", c.len));
}

double overlong_penalty(const OverlongConfig& c, int64_t response_length) {
  if (!c.enable) return 0.0;
  validate(c);
  const int64_t expected = c.max_response_length - c.len;
  const double exceed = static_cast<double>(response_length - expected);
  return std::min(-exceed / static_cast<double>(c.len) * c.penalty_factor, 0.0);
}

void apply_overlong_penalty(const OverlongConfig& c, std::span<const int64_t> lengths, std::span<double> scores) {
  if (lengths.size() != scores.size())
    throw ValueError(str("apply_overlong_penalty: ", lengths.size(), " lengths for ", scores.size(), " scores"));
  if (!c.enable) return;
  validate(c);
  for (size_t i = 0; i < scores.size(); ++i) scores[i] += overlong_penalty(c, lengths[i]);
}

}  // namespace rpg::reward
