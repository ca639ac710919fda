#include "rpg/jinja/pystr.h"

#include <algorithm>
#include <map>
#include <vector>

#include "rpg/core/error.h"
#include "rpg/core/text.h"
#include "rpg/core/unicode.h"
#include "rpg/jinja/renderer.h"

namespace rpg::jinja {

std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<char32_t> set;
  bool ws = !chars || chars->is_none() || chars->is_undefined();
  if (!ws) {
    for_each_codepoint(chars->s, [&](const CodePoint& c) { set.push_back(c.cp); });
  }
  auto strip_me = [&](char32_t c) { return ws ? py_space(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = s.size();
  if (left) b = for_each_codepoint(s, [&](const CodePoint& c) { return strip_me(c.cp); }, InvalidUtf8::kStop);
  if (right) e = rstrip_codepoints(s, b, e, strip_me);
  return s.substr(b, e - b);
}

List py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (!sep || sep->is_none()) {
    // Runs of whitespace separate; leading / trailing whitespace yields no empty parts.
    size_t i = 0;
    auto next_cp = [&](size_t at, char32_t& c) {
      size_t bad;
      size_t len = decode_utf8(s, at, c, bad);
      if (len == 0) {
        c = kReplacementChar;
        len = bad;
      }
      return len;
    };
    while (i < s.size()) {
      char32_t c;
      size_t len = next_cp(i, c);
      if (py_space(c)) {
        i += len;
        continue;
      }
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) {
        std::string rest = py_strip(s.substr(i), nullptr, false, true);
        out.push_back(Value::str(rest));
        return out;
      }
      size_t j = i;
      while (j < s.size()) {
        size_t l = next_cp(j, c);
        if (py_space(c)) break;
        j += l;
      }
      out.push_back(Value::str(s.substr(i, j - i)));
      i = j;
    }
    return out;
  }
  const std::string& d = sep->s;
  if (d.empty()) throw ValueError("empty separator");
  size_t i = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(out.size()) == maxsplit) break;
    size_t j = s.find(d, i);
    if (j == std::string::npos) break;
    out.push_back(Value::str(s.substr(i, j - i)));
    i = j + d.size();
  }
  out.push_back(Value::str(s.substr(i)));
  return out;
}

namespace {

std::string py_case(const std::string& s, int mode) {  // 0 lower, 1 upper
  std::string out;
  for_each_codepoint(s, [&](const CodePoint& c) {
    if (!c.valid) out.append(s, c.pos, c.len);  // ill-formed bytes pass through
    else append_utf8(out, mode ? unicode::to_upper(c.cp) : unicode::to_lower(c.cp));
  });
  return out;
}

}  // namespace

std::string py_lower(const std::string& s) { return py_case(s, 0); }
std::string py_upper(const std::string& s) { return py_case(s, 1); }

std::string py_capitalize(const std::string& s) {
  if (s.empty()) return s;
  char32_t c;
  size_t bad;
  size_t len = decode_utf8(s, 0, c, bad);
  if (len == 0) return s;
  std::string out;
  append_utf8(out, unicode::to_upper(c));
  return out + py_lower(s.substr(len));
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  size_t i = 0;
  while (i < s.size()) {
    char32_t c;
    size_t bad;
    size_t len = decode_utf8(s, i, c, bad);
    if (len == 0) {
      out.append(s, i, bad);
      i += bad;
      prev_cased = false;
      continue;
    }
    bool cased = unicode::to_upper(c) != c || unicode::to_lower(c) != c;
    append_utf8(out, cased ? (prev_cased ? unicode::to_lower(c) : unicode::to_upper(c)) : c);
    prev_cased = cased;
    i += len;
  }
  return out;
}

std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  std::string out;
  if (!to.empty() && (from.empty() ? s.size() + 1 : s.size() / from.size() + 1) > kMaxOutput / to.size())
    throw ValueError("replace: result too large");
  if (from.empty()) {
    // Python inserts `to` around every character.
    auto off = cp_offsets(s);
    int64_t done = 0;
    for (size_t k = 0; k + 1 < off.size(); ++k) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out.append(s, off[k], off[k + 1] - off[k]);
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t i = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    size_t j = s.find(from, i);
    if (j == std::string::npos) break;
    out.append(s, i, j - i);
    out += to;
    i = j + from.size();
    ++done;
  }
  out.append(s, i);
  return out;
}

const Value& need_str(const Value* v, const char* what) {
  if (!v || !v->is_str()) throw ValueError(str(what, ": expected a string argument"));
  return *v;
}

int64_t int_arg(const Value* v, int64_t dflt, const char* what) {
  if (!v || v->is_none()) return dflt;
  if (v->t == Value::T::kInt) return v->i;
  if (v->t == Value::T::kBool) return v->b;
  throw ValueError(str(what, ": expected an integer argument"));
}

namespace {

Value m_strip(const std::string& s, const std::string& name, Args& a) {
  bool left = name != "rstrip", right = name != "lstrip";
  return Value::str(py_strip(s, a.get(0, "chars"), left, right));
}

Value m_split(const std::string& s, const std::string& name, Args& a) {
  return Value::make_list(py_split(s, a.get(0, "sep"), int_arg(a.get(1, "maxsplit"), -1, "split")));
}

Value m_startswith(const std::string& s, const std::string& name, Args& a) {
  const Value* p = a.get(0, "prefix");
  if (!p) throw ValueError(str(name, ": missing argument"));
  List options = p->is_list() ? *p->list : List{*p};
  for (auto& o : options) {
    if (!o.is_str()) throw ValueError(str(name, ": expected a string argument"));
    bool hit = name == "startswith" ? s.compare(0, o.s.size(), o.s) == 0
                                    : s.size() >= o.s.size() && s.compare(s.size() - o.s.size(), o.s.size(), o.s) == 0;
    if (hit) return Value::boolean(true);
  }
  return Value::boolean(false);
}

Value m_upper(const std::string& s, const std::string&, Args&) { return Value::str(py_upper(s)); }
Value m_lower(const std::string& s, const std::string&, Args&) { return Value::str(py_lower(s)); }
Value m_title(const std::string& s, const std::string&, Args&) { return Value::str(py_title(s)); }
Value m_capitalize(const std::string& s, const std::string&, Args&) { return Value::str(py_capitalize(s)); }

Value m_replace(const std::string& s, const std::string&, Args& a) {
  return Value::str(py_replace(s, need_str(a.get(0, "old"), "replace").s, need_str(a.get(1, "new"), "replace").s,
                               int_arg(a.get(2, "count"), -1, "replace")));
}

// find, rfind, index, count.
Value m_find(const std::string& s, const std::string& name, Args& a) {
  const std::string& sub = need_str(a.get(0, "sub"), name.c_str()).s;
  if (name == "count") {
    if (sub.empty()) return Value::integer(static_cast<int64_t>(cp_count(s)) + 1);
    int64_t n = 0;
    for (size_t i = s.find(sub); i != std::string::npos; i = s.find(sub, i + sub.size())) ++n;
    return Value::integer(n);
  }
  size_t j = name == "rfind" ? s.rfind(sub) : s.find(sub);
  if (j == std::string::npos) {
    if (name == "index") throw ValueError("substring not found");
    return Value::integer(-1);
  }
  return Value::integer(static_cast<int64_t>(cp_count(s.substr(0, j))));
}

Value m_join(const std::string& s, const std::string&, Args& a) {
  const Value* it = a.get(0, "iterable");
  if (!it || !it->is_list()) throw ValueError("join: expected a list");
  std::string out;
  for (size_t k = 0; k < it->list->size(); ++k) {
    if (k) out += s;
    if (!(*it->list)[k].is_str()) throw ValueError("join: sequence item is not a string");
    out += (*it->list)[k].s;
  }
  return Value::str(out);
}

// isdigit, isalpha, isalnum, isspace, islower, isupper.
Value m_is(const std::string& s, const std::string& name, Args&) {
  if (s.empty()) return Value::boolean(false);
  size_t i = 0;
  bool any_cased = false;
  while (i < s.size()) {
    char32_t c;
    size_t bad;
    size_t len = decode_utf8(s, i, c, bad);
    if (len == 0) return Value::boolean(false);
    i += len;
    bool ok;
    if (name == "isdigit") ok = c >= '0' && c <= '9' ? true : unicode::is_number(c) && c < 0x80;
    else if (name == "isalpha") ok = unicode::is_letter(c);
    else if (name == "isalnum") ok = unicode::is_letter(c) || unicode::is_number(c);
    else if (name == "isspace") ok = py_space(c);
    else {
      bool lower = unicode::to_upper(c) != c, upper = unicode::to_lower(c) != c;
      if (lower || upper) any_cased = true;
      ok = name == "islower" ? !upper : !lower;
    }
    if (!ok) return Value::boolean(false);
  }
  if (name == "islower" || name == "isupper") return Value::boolean(any_cased);
  return Value::boolean(true);
}

Value m_splitlines(const std::string& s, const std::string&, Args&) {
  List out;
  size_t i = 0;
  while (i < s.size()) {
    size_t j = s.find('\n', i);
    if (j == std::string::npos) {
      out.push_back(Value::str(s.substr(i)));
      break;
    }
    std::string line = s.substr(i, j - i);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    out.push_back(Value::str(line));
    i = j + 1;
  }
  return Value::make_list(std::move(out));
}

const std::map<std::string, StrMethod, std::less<>> kStrMethods = {
    {"strip", m_strip},           {"lstrip", m_strip},     {"rstrip", m_strip},   {"split", m_split},
    {"startswith", m_startswith}, {"endswith", m_startswith}, {"upper", m_upper}, {"lower", m_lower},
    {"title", m_title},           {"capitalize", m_capitalize}, {"replace", m_replace}, {"find", m_find},
    {"rfind", m_find},            {"index", m_find},       {"count", m_find},     {"join", m_join},
    {"isdigit", m_is},            {"isalpha", m_is},       {"isalnum", m_is},     {"isspace", m_is},
    {"islower", m_is},            {"isupper", m_is},       {"splitlines", m_splitlines}};

}  // namespace

StrMethod find_str_method(std::string_view name) {
  auto it = kStrMethods.find(name);
  return it == kStrMethods.end() ? nullptr : it->second;
}

}  // namespace rpg::jinja
