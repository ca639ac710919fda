#include "rpg/reward/math_dapo.h"

#include <utility>

#include "rpg/reward/text.h"

namespace rpg::reward {
namespace {

using text::is_space;
using text::replace_all;
using U = std::u32string;
using UV = std::u32string_view;

// The normaliser's constants (Minerva / lm-eval-harness, as used by verl's math_dapo).
const std::pair<UV, UV> kSubstitutions[] = {
    {U"an ", U""},  {U"a ", U""},   {U".$", U"$"},           {U"\\$", U""},       {U"\\ ", U""},
    {U" ", U""},    {U"mbox", U"text"}, {U",\\text{and}", U","}, {U"\\text{and}", U","}, {U"\\text{m}", U"\\text{}"},
};

const UV kRemovedExpressions[] = {
    U"square",   U"ways",      U"integers",  U"dollars",  U"mph",       U"inches",     U"hours",
    U"km",       U"units",     U"\\ldots",   U"sue",      U"points",    U"feet",       U"minutes",
    U"digits",   U"cents",     U"degrees",   U"cm",       U"gm",        U"pounds",     U"meters",
    U"meals",    U"edges",     U"students",  U"childrentickets",        U"multiples",  U"\\text{s}",
    U"\\text{.}", U"\\text{\ns}", U"\\text{}^2", U"\\text{}^3", U"\\text{\n}", U"\\text{}", U"\\mathrm{th}",
    U"^\\circ",  U"^{\\circ}", U"\\;",       U",\\!",     U"{,}",       U"\"",         U"\\dots",
};

bool starts_with_at(UV s, size_t i, UV prefix) { return s.size() - i >= prefix.size() && s.substr(i, prefix.size()) == prefix; }

// Applies `fn(line) -> line` to every '\n'-separated line (the regexes below use `.`,
// which never crosses a newline).
template <class Fn>
U per_line(UV s, Fn fn) {
  U out;
  size_t start = 0;
  while (true) {
    size_t nl = s.find(U'\n', start);
    UV line = s.substr(start, nl == UV::npos ? UV::npos : nl - start);
    out += fn(line);
    if (nl == UV::npos) break;
    out.push_back(U'\n');
    start = nl + 1;
  }
  return out;
}

// re.sub(r"(.*?)(\$)(.*?)(\$)(.*)", "$\3$", s): a line with two dollars becomes
// "$" + (text between its first two dollars) + "$".
U sub_dollars(UV s) {
  return per_line(s, [](UV line) -> U {
    size_t a = line.find(U'$');
    if (a == UV::npos) return U(line);
    size_t b = line.find(U'$', a + 1);
    if (b == UV::npos) return U(line);
    U out = U"$";
    out += line.substr(a + 1, b - a - 1);
    out += U"$";
    return out;
  });
}

// re.sub(r"(\\name\{)(.*?)(\})", "\2", s): unwraps up to the first "}" on the same line.
U sub_lazy_group(UV s, UV open) {
  U out;
  size_t stop_from = 0, stop = UV::npos;  // cache of find_first_of("}\n", stop_from)
  bool have_stop = false;
  for (size_t i = 0; i < s.size();) {
    if (starts_with_at(s, i, open)) {
      size_t from = i + open.size();
      if (!have_stop || from < stop_from || (stop != UV::npos && from > stop)) {
        stop_from = from;
        stop = s.find_first_of(U"}\n", from);
        have_stop = true;
      }
      if (stop != UV::npos && s[stop] == U'}') {
        out += s.substr(from, stop - from);
        i = stop + 1;
        continue;
      }
    }
    out.push_back(s[i]);
    ++i;
  }
  return out;
}

// re.sub(r"(\\boxed\{)(.*)(\})", "\2", s): on each line, from the first "\boxed{" to the
// last "}" of that line.
U sub_boxed_greedy(UV s) {
  return per_line(s, [](UV line) -> U {
    size_t i = line.find(U"\\boxed{");
    if (i == UV::npos) return U(line);
    size_t j = line.rfind(U'}');
    if (j == UV::npos || j < i + 7) return U(line);
    U out(line.substr(0, i));
    out += line.substr(i + 7, j - i - 7);
    out += line.substr(j + 1);
    return out;
  });
}

// re.sub(r"(frac)([^{])(.)", r"frac{\2}{\3}", s)
U sub_frac(UV s) {
  U out;
  for (size_t i = 0; i < s.size();) {
    if (starts_with_at(s, i, U"frac") && i + 5 < s.size() && s[i + 4] != U'{' && s[i + 5] != U'\n') {
      out += U"frac{";
      out.push_back(s[i + 4]);
      out += U"}{";
      out.push_back(s[i + 5]);
      out += U"}";
      i += 6;
      continue;
    }
    out.push_back(s[i]);
    ++i;
  }
  return out;
}

// re.sub(r"(sqrt)([^{])", r"sqrt{\2}", s)
U sub_sqrt(UV s) {
  U out;
  for (size_t i = 0; i < s.size();) {
    if (starts_with_at(s, i, U"sqrt") && i + 4 < s.size() && s[i + 4] != U'{') {
      out += U"sqrt{";
      out.push_back(s[i + 4]);
      out += U"}";
      i += 5;
      continue;
    }
    out.push_back(s[i]);
    ++i;
  }
  return out;
}

U normalize(UV answer) {
  size_t eq = answer.rfind(U'=');
  U s(eq == UV::npos ? answer : answer.substr(eq + 1));
  for (const auto& [before, after] : kSubstitutions) s = replace_all(s, before, after);
  for (UV expr : kRemovedExpressions) s = replace_all(s, expr, U"");
  s = sub_dollars(s);
  s = sub_lazy_group(s, U"\\text{");
  s = sub_lazy_group(s, U"\\textbf{");
  s = sub_lazy_group(s, U"\\overline{");
  s = sub_boxed_greedy(s);
  s = sub_frac(s);
  s = sub_sqrt(s);
  s = replace_all(s, U"$", U"");
  U no_commas = replace_all(s, U",", U"");
  if (text::isdigit(no_commas)) s = std::move(no_commas);
  return text::strip(s);
}

bool answer_char(char32_t c, char lower) {
  if (c < 0x80) return (c | 0x20) == static_cast<char32_t>(lower);
  return lower == 's' && c == 0x17F;  // LATIN SMALL LETTER LONG S case-folds to 's'
}

// re.findall(r"(?i)Answer\s*:\s*([^\n]+)", s)[-1]
std::optional<U> extract_answer(UV s) {
  static constexpr char kWord[] = "answer";
  std::optional<U> last;
  size_t n = s.size();
  size_t pos = 0;
  while (pos + 6 <= n) {
    bool matched = false;
    for (size_t i = pos; i + 6 <= n; ++i) {
      bool word = true;
      for (size_t k = 0; k < 6 && word; ++k) word = answer_char(s[i + k], kWord[k]);
      if (!word) continue;
      size_t j = i + 6;
      while (j < n && is_space(s[j])) ++j;
      if (j >= n || s[j] != U':') continue;
      size_t k0 = j + 1, q = k0;
      while (q < n && is_space(s[q])) ++q;
      // \s* backtracks until [^\n] can match: the last non-newline at or before q.
      size_t k = q;
      if (k == n) {
        if (k == k0) continue;
        --k;
        while (k > k0 && s[k] == U'\n') --k;
        if (s[k] == U'\n') continue;
      }
      size_t end = s.find(U'\n', k);
      if (end == UV::npos) end = n;
      last = U(s.substr(k, end - k));
      pos = end;
      matched = true;
      break;
    }
    if (!matched) break;
  }
  return last;
}

std::optional<U> last_boxed(UV s) {
  size_t idx = s.rfind(U"\\boxed{");
  if (idx == UV::npos) return std::nullopt;
  int open = 0;
  for (size_t i = idx; i < s.size(); ++i) {
    if (s[i] == U'{') ++open;
    if (s[i] == U'}') {
      --open;
      if (open == 0) return U(s.substr(idx, i + 1 - idx));
    }
  }
  return std::nullopt;
}

// is_correct_strict_box: the raw content of the last \boxed{} in the final 100 characters.
std::optional<U> strict_box_pred(UV solution) {
  UV tail = solution.size() > 100 ? solution.substr(solution.size() - 100) : solution;
  auto boxed = last_boxed(tail);
  if (!boxed) return std::nullopt;
  return boxed->substr(7, boxed->size() - 8);
}

}  // namespace

std::string dapo_normalize(std::string_view answer) { return text::encode(normalize(text::decode(answer))); }

std::optional<std::string> dapo_extract_answer(std::string_view response) {
  auto a = extract_answer(text::decode(response));
  if (!a) return std::nullopt;
  return text::encode(*a);
}

std::optional<std::string> last_boxed_only_string(std::string_view s) {
  auto b = last_boxed(text::decode(s));
  if (!b) return std::nullopt;
  return text::encode(*b);
}

namespace {

ScoreResult dapo_score_impl(std::string_view response, std::string_view ground_truth, bool strict_box,
                            bool boxed_fallback) {
  const U solution = text::decode_last(response, 300);
  const U gt = text::decode(ground_truth);
  bool correct;
  std::optional<U> pred;
  if (strict_box) {
    pred = strict_box_pred(solution);
    correct = pred && *pred == gt;
  } else {
    auto extracted = extract_answer(solution);
    U minerva = normalize(extracted ? UV(*extracted) : UV(U"[INVALID]"));
    bool minerva_correct = minerva == normalize(gt);
    if (minerva != U"[INVALID]") {
      correct = minerva_correct;
      pred = std::move(minerva);
    } else if (auto box = boxed_fallback ? strict_box_pred(solution) : std::nullopt) {
      correct = *box == gt;
      pred = std::move(box);
    } else {
      correct = minerva_correct;
      pred = std::move(minerva);
    }
  }
  ScoreResult r;
  r.score = correct ? 1.0 : -1.0;
  r.acc = correct;
  if (pred) r.pred = text::encode(*pred);
  return r;
}

}  // namespace

ScoreResult dapo_score(std::string_view response, std::string_view ground_truth, bool strict_box) {
  return dapo_score_impl(response, ground_truth, strict_box, /*boxed_fallback=*/true);
}

ScoreResult dapo_score_fork(std::string_view response, std::string_view ground_truth, bool strict_box) {
  return dapo_score_impl(response, ground_truth, strict_box, /*boxed_fallback=*/false);
}

}  // namespace rpg::reward
