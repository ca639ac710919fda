// Every registered scorer finishes quickly on adversarial responses and ground truths
// (1 MB strings, deep braces, thousands of Answer: lines, invalid UTF-8). verl's regexes
// are not linear-time in general; ours must be. Also: the lossless UTF-8 decoding.
#include <gtest/gtest.h>

#include <chrono>
#include <random>
#include <string>
#include <vector>

#include "rpg/reward/math_dapo.h"
#include "rpg/reward/math_lighteval.h"
#include "rpg/reward/registry.h"
#include "rpg/reward/text.h"

namespace rpg::test {
namespace {

std::string repeat(const std::string& s, size_t bytes) {
  std::string out;
  while (out.size() < bytes) out += s;
  return out;
}

std::vector<std::pair<std::string, std::string>> adversarial_inputs() {
  const size_t MB = 1 << 20;
  std::mt19937 rng(7);
  std::string random_bytes(MB, '\0'), random_ascii(MB, '\0');
  for (auto& c : random_bytes) c = static_cast<char>(rng() & 0xFF);
  const std::string alphabet = "Answer: \\boxed{}$=frac sqrt\\text{ }\n,.0123456789";
  for (auto& c : random_ascii) c = alphabet[rng() % alphabet.size()];
  return {
      {"1 MB random bytes", random_bytes},
      {"1 MB random LaTeX-ish ASCII", random_ascii},
      {"1 MB of '{'", std::string(MB, '{')},
      {"1 MB of '}'", std::string(MB, '}')},
      {"nested braces", repeat("\\boxed{", MB / 2) + repeat("}", MB / 2)},
      {"unclosed \\boxed{", repeat("\\boxed{", MB)},
      {"100k Answer: lines", repeat("Answer: 1\n", MB)},
      {"Answer: then 1 MB whitespace", "Answer:" + std::string(MB, ' ')},
      {"Answer: then 1 MB newlines", "Answer:" + std::string(MB, '\n')},
      {"1 MB without newline after Answer:", "Answer: " + std::string(MB, 'x')},
      {"\\text{ unclosed", repeat("\\text{", MB)},
      {"\\text{ with spaces", repeat("\\text{ ", MB)},
      {"dollars", std::string(MB, '$')},
      {"equals", std::string(MB, '=')},
      {"\\boxed space", repeat("\\boxed 1$", MB)},
      {"\\sqrt and \\frac", repeat("\\sqrt\\frac", MB)},
      {"'a ' repeated", repeat("a ", MB)},
      {"truncated UTF-8 sequences", repeat("\xE2\x82", MB)},
      {"lone continuation bytes", std::string(MB, '\x80')},
      {"4-byte characters", repeat("\xF0\x9F\x98\x80", MB)},
  };
}

TEST(RewardRobustness, EveryScorerIsFastOnAdversarialInputs) {
  auto plain = reward::builtin_scorers();
  auto strict = reward::builtin_scorers({.strict_box_verify = true});
  double worst_ms = 0;
  std::string worst;
  for (const auto& [name, text] : adversarial_inputs()) {
    for (const auto* reg : {&plain, &strict}) {
      for (const auto& [key, doc] : reg->entries()) {
        std::string ds = key.back() == '*' ? key.substr(0, key.size() - 1) + "x" : key;
        const auto& fn = reg->find(ds);
        for (int as_gt = 0; as_gt < 2; ++as_gt) {
          auto t0 = std::chrono::steady_clock::now();
          auto r = as_gt ? fn("Answer: 5", text) : fn(text, "5");
          double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
          EXPECT_TRUE(r.score == 1.0 || r.score == -1.0 || r.score == 0.0);
          EXPECT_LT(ms, 2000.0) << key << " on " << name << (as_gt ? " (as ground truth)" : "");
          if (ms > worst_ms) worst_ms = ms, worst = key + " on " + name + (as_gt ? " (gt)" : "");
        }
      }
    }
  }
  std::cout << "[ figure ] slowest adversarial scoring: " << worst_ms << " ms (" << worst << ")\n";
}

TEST(RewardRobustness, NormalisersAndExtractorsAreLinearOnMegabytes) {
  for (const auto& [name, text] : adversarial_inputs()) {
    auto t0 = std::chrono::steady_clock::now();
    (void)reward::dapo_normalize(text);
    (void)reward::dapo_extract_answer(text);
    (void)reward::last_boxed_only_string(text);
    (void)reward::lighteval_strip_string(text);
    double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(ms, 3000.0) << name;
  }
}

TEST(RewardText, DecodingIsLosslessAndCountsCharactersLikePython) {
  // Hand-counted: 'a', U+00E9, U+20AC, U+1F600, then 4 invalid bytes (lone continuation,
  // truncated 3-byte lead + 1 continuation = 2 units, an 0xFF).
  std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\x80\xE2\x82\xFF";
  auto u = reward::text::decode(s);
  ASSERT_EQ(u.size(), 8u);
  EXPECT_EQ(u[1], 0xE9u);
  EXPECT_EQ(u[2], 0x20ACu);
  EXPECT_EQ(u[3], 0x1F600u);
  EXPECT_EQ(u[4], 0xDC80u);
  EXPECT_EQ(u[5], 0xDCE2u);
  EXPECT_EQ(u[7], 0xDCFFu);
  EXPECT_EQ(reward::text::encode(u), s);
  // Overlong encodings and UTF-16 surrogates are not UTF-8: one character per byte.
  EXPECT_EQ(reward::text::decode("\xC0\xAF").size(), 2u);
  EXPECT_EQ(reward::text::decode("\xED\xA0\x80").size(), 3u);
  EXPECT_EQ(reward::text::decode("\xF4\x90\x80\x80").size(), 4u);
  for (size_t n : {0, 1, 3, 5, 8, 20}) {
    auto tail = reward::text::decode_last(s, n);
    EXPECT_EQ(tail, u.substr(u.size() - std::min(n, u.size()))) << n;
  }
  std::string long_s = std::string(5000, '\x80') + s;
  EXPECT_EQ(reward::text::decode_last(long_s, 300).size(), 300u);
  EXPECT_EQ(reward::text::decode_last(long_s, 8), u);
}

}  // namespace
}  // namespace rpg::test
