#include "rpg/reward/math_lighteval.h"

#include "rpg/reward/text.h"

namespace rpg::reward {
namespace {

using text::contains;
using text::replace_all;
using text::split;
using U = std::u32string;
using UV = std::u32string_view;

// Python's `int(x)` succeeds and `str(int(x)) == x`: a canonical decimal integer
// (no sign other than '-', no leading zeros, not "-0", at most 4300 digits).
bool canonical_int(UV s) {
  UV d = s;
  if (!d.empty() && d[0] == U'-') d.remove_prefix(1);
  if (d.empty() || d.size() > 4300) return false;
  for (char32_t c : d)
    if (c < U'0' || c > U'9') return false;
  if (d.size() > 1 && d[0] == U'0') return false;
  if (d == U"0" && s.size() != d.size()) return false;
  return true;
}

U fix_a_slash_b(const U& s) {
  auto parts = split(s, U"/");
  if (parts.size() != 2) return s;
  if (!canonical_int(parts[0]) || !canonical_int(parts[1])) return s;
  return U"\\frac{" + parts[0] + U"}{" + parts[1] + U"}";
}

// fix_fracs; nullopt where the Python raises (an empty piece after "\frac").
std::optional<U> fix_fracs(const U& s) {
  auto pieces = split(s, U"\\frac");
  U out = pieces[0];
  for (size_t p = 1; p < pieces.size(); ++p) {
    const U& piece = pieces[p];
    out += U"\\frac";
    if (piece.empty()) return std::nullopt;
    if (piece[0] == U'{') {
      out += piece;
      continue;
    }
    if (piece.size() < 2) return s;
    char32_t a = piece[0], b = piece[1];
    out += U"{";
    out.push_back(a);
    if (b != U'{') {
      out += U"}{";
      out.push_back(b);
      out += U"}";
    } else {
      out += U"}";
      out.push_back(b);
    }
    out += UV(piece).substr(2);
  }
  return out;
}

// fix_sqrt; nullopt where the Python raises ("\sqrt" at the very end).
std::optional<U> fix_sqrt(const U& s) {
  if (!contains(s, U"\\sqrt")) return s;
  auto pieces = split(s, U"\\sqrt");
  U out = pieces[0];
  for (size_t p = 1; p < pieces.size(); ++p) {
    const U& piece = pieces[p];
    if (piece.empty()) return std::nullopt;
    if (piece[0] != U'{') {
      out += U"\\sqrt{";
      out.push_back(piece[0]);
      out += U"}";
      out += UV(piece).substr(1);
    } else {
      out += U"\\sqrt" + piece;
    }
  }
  return out;
}

std::optional<U> strip_string(U s) {
  s = replace_all(s, U"\n", U"");
  s = replace_all(s, U"\\!", U"");
  s = replace_all(s, U"\\\\", U"\\");
  s = replace_all(s, U"tfrac", U"frac");
  s = replace_all(s, U"dfrac", U"frac");
  s = replace_all(s, U"\\left", U"");
  s = replace_all(s, U"\\right", U"");
  s = replace_all(s, U"^{\\circ}", U"");
  s = replace_all(s, U"^\\circ", U"");
  s = replace_all(s, U"\\$", U"");
  if (contains(s, U"\\text{ ")) {  // remove_right_units
    auto pieces = split(s, U"\\text{ ");
    if (pieces.size() != 2) return std::nullopt;
    s = pieces[0];
  }
  s = replace_all(s, U"\\\\%", U"");
  s = replace_all(s, U"\\%", U"");
  s = replace_all(s, U" .", U" 0.");
  s = replace_all(s, U"{.", U"{0.");
  if (s.empty()) return s;
  if (s[0] == U'.') s = U"0" + s;
  {
    auto parts = split(s, U"=");
    if (parts.size() == 2 && parts[0].size() <= 2) s = parts[1];
  }
  auto sq = fix_sqrt(s);
  if (!sq) return std::nullopt;
  s = replace_all(*sq, U" ", U"");
  auto fr = fix_fracs(s);
  if (!fr) return std::nullopt;
  s = std::move(*fr);
  if (s == U"0.5") s = U"\\frac{1}{2}";
  return fix_a_slash_b(s);
}

bool is_equiv(const U& a, const U& b) {
  auto sa = strip_string(a);
  if (!sa) return a == b;
  auto sb = strip_string(b);
  if (!sb) return a == b;
  return *sa == *sb;
}

// last_boxed_only_string of math_reward. Every pattern is ASCII and an ASCII byte never
// occurs inside a multi-byte UTF-8 sequence, so this works on the bytes directly (only the
// extracted answer is decoded): the same result as on code points, in one pass.
std::optional<std::string_view> last_boxed_only_string(std::string_view s) {
  if (size_t at = s.rfind("\\boxed "); at != std::string_view::npos) {
    std::string_view after = s.substr(at + 7);  // split("\\boxed ")[-1]
    return s.substr(at, 7 + after.substr(0, after.find('$')).size());
  }
  size_t idx = s.rfind("\\boxed");
  if (idx == std::string_view::npos) {
    idx = s.rfind("\\fbox");
    if (idx == std::string_view::npos) return std::nullopt;
  }
  int64_t open = 0;
  for (size_t i = idx; i < s.size(); ++i) {
    if (s[i] == '{') ++open;
    if (s[i] == '}') {
      --open;
      if (open == 0) return s.substr(idx, i + 1 - idx);
    }
  }
  return std::nullopt;
}

// remove_boxed; nullopt where the Python's assertions fail.
std::optional<U> remove_boxed(const U& s) {
  if (contains(s, U"\\boxed ")) {
    if (s.rfind(U"\\boxed ", 0) != 0) return std::nullopt;
    return s.substr(7);
  }
  if (s.rfind(U"\\boxed{", 0) != 0 || s.back() != U'}') return std::nullopt;
  return s.substr(7, s.size() - 8);
}

}  // namespace

std::optional<std::string> lighteval_strip_string(std::string_view s) {
  auto r = strip_string(text::decode(s));
  if (!r) return std::nullopt;
  return text::encode(*r);
}

bool lighteval_is_equiv(std::string_view a, std::string_view b) { return is_equiv(text::decode(a), text::decode(b)); }

ScoreResult lighteval_score(std::string_view response, std::string_view ground_truth) {
  ScoreResult r;
  auto boxed = last_boxed_only_string(response);
  if (!boxed) return r;
  auto answer = remove_boxed(text::decode(*boxed));
  if (!answer) return r;
  r.pred = text::encode(*answer);
  r.acc = is_equiv(*answer, text::decode(ground_truth));
  r.score = r.acc ? 1.0 : 0.0;
  return r;
}

}  // namespace rpg::reward
