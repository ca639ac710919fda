// The UTF-8 decoder every code-point loop uses: well-formed sequences per Unicode Table 3-7,
// maximal ill-formed subparts as Python's errors="replace" cuts them, surrogateescape bytes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "rpg/core/text.h"

namespace {

struct Walk {
  std::vector<char32_t> cps;
  std::vector<size_t> lens;
  size_t end;
};

Walk walk(std::string_view s, rpg::InvalidUtf8 mode) {
  Walk w;
  w.end = rpg::for_each_codepoint(
      s,
      [&](const rpg::CodePoint& c) {
        w.cps.push_back(c.cp);
        w.lens.push_back(c.len);
      },
      mode);
  return w;
}

std::vector<char32_t> replaced(std::string_view s) { return walk(s, rpg::InvalidUtf8::kReplace).cps; }

constexpr char32_t R = 0xFFFD;

TEST(Utf8, WellFormedOneToFourBytes) {
  auto w = walk("a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80\xF4\x8F\xBF\xBF", rpg::InvalidUtf8::kReplace);
  EXPECT_EQ(w.cps, (std::vector<char32_t>{'a', 0xE9, 0x20AC, 0x1F600, 0x10FFFF}));
  EXPECT_EQ(w.lens, (std::vector<size_t>{1, 2, 3, 4, 4}));
  EXPECT_EQ(w.end, 14u);
  // Boundaries of each length.
  EXPECT_EQ(replaced("\xC2\x80\xDF\xBF\xE0\xA0\x80\xEF\xBF\xBF\xF0\x90\x80\x80"),
            (std::vector<char32_t>{0x80, 0x7FF, 0x800, 0xFFFF, 0x10000}));
}

TEST(Utf8, OverlongFormsAreIllFormed) {
  // Python: b"\xc0\xaf".decode(errors="replace") == "\ufffd\ufffd"; "\xe0\x80\xaf" -> 3 x U+FFFD.
  EXPECT_EQ(replaced("\xC0\xAF"), (std::vector<char32_t>{R, R}));
  EXPECT_EQ(replaced("\xC1\xBF"), (std::vector<char32_t>{R, R}));
  EXPECT_EQ(replaced("\xE0\x80\xAF"), (std::vector<char32_t>{R, R, R}));
  EXPECT_EQ(replaced("\xF0\x80\x80\xAF"), (std::vector<char32_t>{R, R, R, R}));
}

TEST(Utf8, SurrogatesAndAboveMaxAreIllFormed) {
  EXPECT_EQ(replaced("\xED\xA0\x80"), (std::vector<char32_t>{R, R, R}));  // U+D800
  EXPECT_EQ(replaced("\xED\xBF\xBF"), (std::vector<char32_t>{R, R, R}));  // U+DFFF
  EXPECT_EQ(replaced("\xED\x9F\xBF"), (std::vector<char32_t>{0xD7FF}));
  EXPECT_EQ(replaced("\xF4\x90\x80\x80"), (std::vector<char32_t>{R, R, R, R}));  // U+110000
  EXPECT_EQ(replaced("\xF5\x80\x80\x80"), (std::vector<char32_t>{R, R, R, R}));
  EXPECT_EQ(replaced("\xFF"), (std::vector<char32_t>{R}));
}

TEST(Utf8, TruncatedSequencesAreOneMaximalSubpart) {
  // Python: b"\xf0\x9f\x98".decode(errors="replace") == "\ufffd" (one, not three);
  // b"\xe2\x82a" -> "\ufffda"; a lone continuation byte is its own subpart.
  auto w = walk("\xF0\x9F\x98", rpg::InvalidUtf8::kReplace);
  EXPECT_EQ(w.cps, (std::vector<char32_t>{R}));
  EXPECT_EQ(w.lens, (std::vector<size_t>{3}));
  EXPECT_EQ(replaced("\xE2\x82" "a"), (std::vector<char32_t>{R, 'a'}));
  EXPECT_EQ(replaced("\xC3"), (std::vector<char32_t>{R}));
  EXPECT_EQ(replaced("\x80\x80"), (std::vector<char32_t>{R, R}));
  EXPECT_EQ(replaced("\xF0\x9F\x98\xF0\x9F\x98\x80"), (std::vector<char32_t>{R, 0x1F600}));
}

TEST(Utf8, EscapeModeIsOneSurrogatePerByteAndStopModeStops) {
  auto w = walk("a\xF0\x9F\x98" "b", rpg::InvalidUtf8::kEscape);
  EXPECT_EQ(w.cps, (std::vector<char32_t>{'a', 0xDCF0, 0xDC9F, 0xDC98, 'b'}));
  auto s = walk("ab\xC3(", rpg::InvalidUtf8::kStop);
  EXPECT_EQ(s.cps, (std::vector<char32_t>{'a', 'b'}));
  EXPECT_EQ(s.end, 2u);
  // A bool-returning callback stops the walk where it says.
  size_t stop = rpg::for_each_codepoint("  \xE3\x80\x80x", [](const rpg::CodePoint& c) { return c.cp != 'x'; });
  EXPECT_EQ(stop, 5u);
}

TEST(Utf8, AppendAndSanitizeRoundTrip) {
  std::string out;
  for (char32_t c : {char32_t{'a'}, char32_t{0xE9}, char32_t{0x20AC}, char32_t{0x1F600}}) rpg::append_utf8(out, c);
  EXPECT_EQ(out, "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  std::string clean;
  EXPECT_TRUE(rpg::sanitize_utf8(out, clean));
  EXPECT_FALSE(rpg::sanitize_utf8("x\xF0\x9F\x98y", clean));
  EXPECT_EQ(clean, "x\xEF\xBF\xBDy");
}

TEST(ShortJsonError, CutsTheLastReadExcerptToItsTailOnACodePointBoundary) {
  // nlohmann's message for a file cut inside a long string: the whole string so far.
  std::string token = "{{ 'x' }}" + std::string(100, 'a') + "\xC3\xA9" + std::string(38, 'b');
  const std::string what = "[json.exception.parse_error.101] parse error at line 1, column 160: syntax error while "
                           "parsing value - invalid string: missing closing quote; last read: '\"" + token + "'";
  const std::string short_what = rpg::short_json_error(what);
  EXPECT_EQ(short_what, what.substr(0, what.find("last read: '") + 12) + "..." + "\xC3\xA9" + std::string(38, 'b') + "'");
  // 39 bytes would start inside the 2-byte \xC3\xA9: the cut moves past it, never leaving a
  // bare continuation byte.
  EXPECT_EQ(rpg::short_json_error(what, 39), what.substr(0, what.find("last read: '") + 12) + "..." +
                                                   std::string(38, 'b') + "'");
  // With "; expected ..." after the excerpt, and short excerpts, nothing else changes.
  const std::string expected = "parse error; last read: '" + token + "'; expected string literal";
  EXPECT_EQ(rpg::short_json_error(expected, 10), "parse error; last read: '..." + std::string(10, 'b') + "'; expected string literal");
  EXPECT_EQ(rpg::short_json_error("parse error; last read: 'no'"), "parse error; last read: 'no'");
  EXPECT_EQ(rpg::short_json_error("type_error.302: type must be string"), "type_error.302: type must be string");
}

}  // namespace
