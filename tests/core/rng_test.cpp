#include "rpg/core/rng.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>

namespace rpg {
namespace {

// Known-answer vectors of Philox-4x32-10 from the Random123 distribution (tests/kat_vectors).
TEST(Rng, PhiloxKnownAnswers) {
  using A = std::array<uint32_t, 4>;
  EXPECT_EQ(philox4x32(0, 0, 0), (A{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}));
  EXPECT_EQ(philox4x32(~0ull, ~0ull, ~0ull), (A{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}));
  // counter words (0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344), key words (0xa4093822, 0x299f31d0)
  EXPECT_EQ(philox4x32(0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3243f6a88ull),
            (A{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}));
}

TEST(Rng, StreamIsAPureFunctionOfKeyAndPosition) {
  RandomStream a(42);
  std::vector<double> first;
  for (int i = 0; i < 10; ++i) first.push_back(a.uniform());
  RandomStream b(42, 7);
  EXPECT_EQ(b.uniform(), first[7]);
  EXPECT_EQ(b.position(), 8u);
  RandomStream other(43);
  EXPECT_NE(other.uniform(), first[0]);
  EXPECT_NE(mix_key(1, 2), mix_key(2, 1));
}

TEST(Rng, UniformPassesChiSquare) {
  RandomStream s(mix_key(7, 11));
  const int bins = 64, n = 640000;
  std::vector<int> count(bins);
  for (int i = 0; i < n; ++i) {
    double u = s.uniform();
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    ++count[static_cast<size_t>(u * bins)];
  }
  double chi2 = 0, expected = static_cast<double>(n) / bins;
  for (int c : count) chi2 += (c - expected) * (c - expected) / expected;
  // 63 degrees of freedom: the 99.99th percentile is about 117.
  EXPECT_LT(chi2, 117.0);
}

TEST(Rng, PermutationsAreValidAndUniform) {
  std::map<std::vector<int64_t>, int> seen;
  const int trials = 24000;
  for (int t = 0; t < trials; ++t) {
    auto p = random_permutation(4, mix_key(99, static_cast<uint64_t>(t)));
    auto sorted = p;
    std::sort(sorted.begin(), sorted.end());
    ASSERT_EQ(sorted, (std::vector<int64_t>{0, 1, 2, 3}));
    ++seen[p];
  }
  ASSERT_EQ(seen.size(), 24u);
  double chi2 = 0, expected = trials / 24.0;
  for (const auto& [p, c] : seen) chi2 += (c - expected) * (c - expected) / expected;
  EXPECT_LT(chi2, 60.0);  // 23 dof, 99.99th percentile ~ 56
  EXPECT_EQ(random_permutation(1000, 5), random_permutation(1000, 5));
  EXPECT_TRUE(random_permutation(0, 5).empty());
}

}  // namespace
}  // namespace rpg
