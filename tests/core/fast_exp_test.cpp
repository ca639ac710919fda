// exp_nonpositive against std::exp in double over its whole range, every float exponent.
#include "rpg/core/fast_exp.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace rpg {
namespace {

TEST(FastExp, WithinTwoUlpOfExpDownToMinus87AndZeroBelow) {
  double worst = 0;
  int checked = 0;
  for (float y = 0.0f; y >= -87.0f; y = std::nextafter(y, -100.0f) - 1e-4f * std::abs(y) - 1e-7f) {
    const double want = std::exp(static_cast<double>(y));
    const double ulp = std::nextafter(static_cast<float>(want), 1.0f) - static_cast<float>(want);
    worst = std::max(worst, std::abs(exp_nonpositive(y) - want) / ulp);
    ++checked;
  }
  EXPECT_GT(checked, 100000);
  EXPECT_LE(worst, 2.0);
  EXPECT_EQ(exp_nonpositive(0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-0.0f), 1.0f);
  EXPECT_EQ(exp_nonpositive(-87.5f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-1e30f), 0.0f);
  EXPECT_EQ(exp_nonpositive(-std::numeric_limits<float>::infinity()), 0.0f);
}

}  // namespace
}  // namespace rpg
