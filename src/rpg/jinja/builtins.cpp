#include "rpg/jinja/builtins.h"

#include <algorithm>
#include <limits>
#include <cmath>
#include <ctime>
#include <map>

#include "rpg/core/error.h"
#include "rpg/core/text.h"
#include "rpg/core/unicode.h"
#include "rpg/jinja/pystr.h"
#include "rpg/jinja/renderer.h"

namespace rpg::jinja {

namespace {

Value attr_path(const Value& v, const std::string& path, Renderer& r, Pos at) {
  Value cur = v;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('.', i);
    if (j == std::string::npos) j = path.size();
    std::string part = path.substr(i, j - i);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    if (digits) {
      // jinja2 turns a digit part into a Python int of any size; past int64 no list or
      // string has such an index, so the largest one gives the same undefined.
      int64_t idx = std::numeric_limits<int64_t>::max();
      try {
        idx = std::stoll(part);
      } catch (const std::out_of_range&) {
      }
      cur = r.get_item(cur, Value::integer(idx), at);
    } else {
      cur = r.get_item(cur, Value::str(part), at);
    }
    i = j + 1;
  }
  return cur;
}

int sort_cmp(const Value& a, const Value& b, bool case_sensitive, Renderer& r, Pos at) {
  if (a.is_str() && b.is_str() && !case_sensitive) {
    std::string x = py_lower(a.s), y = py_lower(b.s);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (r.compare("<", a, b, at)) return -1;
  if (r.compare("<", b, a, at)) return 1;
  return 0;
}

// ---- filters ----

Value f_trim(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  return Value::str(py_strip(to_str(v), a.get(0, "chars"), true, true));
}

// transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
Value f_tojson(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  bool ensure_ascii = a.get(0, "ensure_ascii") && truthy(*a.get(0, "ensure_ascii"));
  const Value* ind = a.get(1, "indent");
  int indent = -1;
  if (ind && !ind->is_none()) {
    if (ind->t != Value::T::kInt) throw ValueError("indent must be an integer");
    indent = static_cast<int>(std::clamp<int64_t>(ind->i, 0, 64));
  }
  std::string item_sep = indent >= 0 ? "," : ", ", key_sep = ": ";
  if (const Value* sep = a.get(2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_list() || sep->list->size() != 2 || !(*sep->list)[0].is_str() || !(*sep->list)[1].is_str())
      throw ValueError("separators must be a pair of strings");
    item_sep = (*sep->list)[0].s;
    key_sep = (*sep->list)[1].s;
  }
  bool sort_keys = a.get(3, "sort_keys") && truthy(*a.get(3, "sort_keys"));
  return Value::str(to_json(v, ensure_ascii, indent, item_sep, key_sep, sort_keys));
}

Value f_length(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  if (v.is_str()) return Value::integer(static_cast<int64_t>(cp_count(v.s)));
  if (v.is_list()) return Value::integer(static_cast<int64_t>(v.list->size()));
  if (v.is_dict()) return Value::integer(static_cast<int64_t>(v.dict->items.size()));
  if (v.is_undefined()) return Value::integer(0);
  throw ValueError(str("object of type '", type_name(v), "' has no len()"));
}

Value f_string(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  return Value::str(to_str(v));
}

Value f_safe(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) { return v; }

Value f_escape(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  return Value::str(html_escape(to_str(v)));
}

Value f_upper(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  return Value::str(py_upper(to_str(v)));
}

Value f_lower(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  return Value::str(py_lower(to_str(v)));
}

// jinja2's own title: words start after whitespace, '-', '(', '{', '[' or '<'; the
// first character of each goes upper case and the rest lower case.
Value f_title(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  std::string s = to_str(v), out, word;
  auto flush = [&] {
    if (!word.empty()) out += py_capitalize(word);
    word.clear();
  };
  for_each_codepoint(s, [&](const CodePoint& c) {
    bool sep = py_space(c.cp) || c.cp == '-' || c.cp == '(' || c.cp == '{' || c.cp == '[' || c.cp == '<';
    if (sep) flush();
    (sep ? out : word).append(s, c.pos, c.len);
  });
  flush();
  return Value::str(out);
}

Value f_capitalize(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  return Value::str(py_capitalize(to_str(v)));
}

Value f_replace(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  return Value::str(py_replace(to_str(v), to_str(need_str(a.get(0, "old"), "replace")),
                               to_str(need_str(a.get(1, "new"), "replace")), int_arg(a.get(2, "count"), -1, "replace")));
}

Value f_default(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  const Value* dv = a.get(0, "default_value");
  bool boolean = a.get(1, "boolean") && truthy(*a.get(1, "boolean"));
  if (v.is_undefined() || (boolean && !truthy(v))) return dv ? *dv : Value::str("");
  return v;
}

Value f_first_last(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  List items = r.iterate(v, at);
  if (items.empty()) return Value::undefined(name);
  return name == "first" ? items.front() : items.back();
}

Value f_list(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  return Value::make_list(r.iterate(v, at));
}

Value f_reverse(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  if (v.is_str()) {
    List chars = r.iterate(v, at);
    std::string out;
    for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->s;
    return Value::str(out);
  }
  List items = r.iterate(v, at);
  std::reverse(items.begin(), items.end());
  return Value::make_list(std::move(items));
}

Value f_join(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  std::string sep = a.get(0, "d") ? to_str(*a.get(0, "d")) : "";
  const Value* attr = a.get(1, "attribute");
  std::string out;
  bool first = true;
  for (auto& x : r.iterate(v, at)) {
    if (!first) out += sep;
    first = false;
    out += to_str(attr ? attr_path(x, to_str(*attr), r, at) : x);
  }
  return Value::str(out);
}

Value f_int(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  if (v.is_undefined()) throw ValueError(str("'", v.s.empty() ? "value" : v.s, "' is undefined"));
  if (v.t == Value::T::kInt) return v;
  if (v.t == Value::T::kBool) return Value::integer(v.b);
  if (v.t == Value::T::kFloat) {
    if (!(std::fabs(v.f) < 9.2e18)) throw ValueError("cannot convert float to integer");
    return Value::integer(static_cast<int64_t>(v.f));
  }
  if (v.is_str()) {
    try {
      size_t used = 0;
      std::string s = py_strip(v.s, nullptr, true, true);
      int64_t x = std::stoll(s, &used);
      if (used == s.size()) return Value::integer(x);
    } catch (const std::exception&) {
    }
    // int() failed: jinja2 retries int(float(value)).
    std::string t = py_strip(v.s, nullptr, true, true);
    char* end = nullptr;
    double d = std::strtod(t.c_str(), &end);
    bool hexish = t.find_first_of("xXpP") != std::string::npos;
    if (!t.empty() && end == t.c_str() + t.size() && !hexish && std::isfinite(d) && std::fabs(d) < 9.2e18)
      return Value::integer(static_cast<int64_t>(d));
  }
  return a.get(0, "default") ? *a.get(0, "default") : Value::integer(0);
}

Value f_float(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  if (v.is_undefined()) throw ValueError(str("'", v.s.empty() ? "value" : v.s, "' is undefined"));
  if (v.is_number()) return Value::real(v.as_double());
  if (v.is_str()) {
    std::string s = py_strip(v.s, nullptr, true, true);
    char* end = nullptr;
    double x = std::strtod(s.c_str(), &end);
    if (!s.empty() && end == s.c_str() + s.size()) return Value::real(x);
  }
  return a.get(0, "default") ? *a.get(0, "default") : Value::real(0);
}

Value f_abs(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  if (v.t == Value::T::kInt) {
    if (v.i == INT64_MIN) throw ValueError("integer overflow");
    return Value::integer(v.i < 0 ? -v.i : v.i);
  }
  if (v.t == Value::T::kFloat) return Value::real(std::fabs(v.f));
  if (v.t == Value::T::kBool) return Value::integer(v.b);
  throw ValueError(str("bad operand type for abs(): '", type_name(v), "'"));
}

Value f_round(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  if (!v.is_number()) throw ValueError(str("type ", type_name(v), " doesn't define __round__ method"));
  int64_t prec = int_arg(a.get(0, "precision"), 0, "round");
  std::string how = a.get(1, "method") ? to_str(*a.get(1, "method")) : "common";
  if (how == "common" && v.t != Value::T::kFloat && prec >= 0) return Value::integer(v.t == Value::T::kBool ? v.b : v.i);
  std::string method = a.get(1, "method") ? to_str(*a.get(1, "method")) : "common";
  double x = v.as_double(), m = std::pow(10.0, static_cast<double>(prec));
  double y;
  if (method == "floor") {
    y = std::floor(x * m) / m;
  } else if (method == "ceil") {
    y = std::ceil(x * m) / m;
  } else if (prec >= 0 && prec < 300) {
    // Python's round() rounds the exact binary value half-to-even, as printf does.
    char buf[512];
    std::snprintf(buf, sizeof buf, "%.*f", static_cast<int>(prec), x);
    y = std::strtod(buf, nullptr);
  } else {
    y = std::nearbyint(x * m) / m;
  }
  return Value::real(y);
}

Value f_items(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  if (v.is_undefined()) return Value::make_list();
  if (!v.is_dict()) throw ValueError("items: expected a mapping");
  List out;
  for (auto& [k, x] : v.dict->items) out.push_back(Value::make_tuple({Value::str(k), x}));
  return Value::make_list(std::move(out));
}

Value f_dictsort(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  if (!v.is_dict()) throw ValueError("dictsort: expected a mapping");
  bool cs = a.get(0, "case_sensitive") && truthy(*a.get(0, "case_sensitive"));
  bool by_value = a.get(1, "by") && to_str(*a.get(1, "by")) == "value";
  bool rev = a.get(2, "reverse") && truthy(*a.get(2, "reverse"));
  List out;
  for (auto& [k, x] : v.dict->items) out.push_back(Value::make_tuple({Value::str(k), x}));
  std::stable_sort(out.begin(), out.end(), [&](const Value& p, const Value& q) {
    int c = sort_cmp((*p.list)[by_value], (*q.list)[by_value], cs, r, at);
    return rev ? c > 0 : c < 0;
  });
  return Value::make_list(std::move(out));
}

Value f_sort(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  bool rev = a.get(0, "reverse") && truthy(*a.get(0, "reverse"));
  bool cs = a.get(1, "case_sensitive") && truthy(*a.get(1, "case_sensitive"));
  const Value* attr = a.get(2, "attribute");
  List items = r.iterate(v, at);
  std::stable_sort(items.begin(), items.end(), [&](const Value& p, const Value& q) {
    Value x = attr ? attr_path(p, to_str(*attr), r, at) : p, y = attr ? attr_path(q, to_str(*attr), r, at) : q;
    int c = sort_cmp(x, y, cs, r, at);
    return rev ? c > 0 : c < 0;
  });
  return Value::make_list(std::move(items));
}

Value f_unique(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  List out;
  for (auto& x : r.iterate(v, at)) {
    if ((x.is_list() && !x.tuple) || x.is_dict()) throw ValueError(str("unhashable type: '", type_name(x), "'"));
    bool seen = false;
    for (auto& y : out)
      if (x.is_str() && y.is_str() ? py_lower(x.s) == py_lower(y.s) : equal(x, y)) seen = true;
    if (!seen) out.push_back(x);
  }
  return Value::make_list(std::move(out));
}

Value f_min_max_sum(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  List items = r.iterate(v, at);
  if (name == "sum") {
    Value acc = a.get(1, "start") ? *a.get(1, "start") : Value::integer(0);
    const Value* attr = a.get(0, "attribute");
    for (auto& x : items) acc = r.binary("+", acc, attr ? attr_path(x, to_str(*attr), r, at) : x, at);
    return acc;
  }
  if (items.empty()) return Value::undefined(name);
  Value best = items[0];
  for (auto& x : items) {
    int c = sort_cmp(x, best, false, r, at);
    if (name == "min" ? c < 0 : c > 0) best = x;
  }
  return best;
}

Value f_select(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  if (!truthy(v)) return Value::make_list();  // jinja2 iterates only `if value`
  bool by_attr = name.size() > 6;
  bool keep_if = name[0] == 's';
  size_t k = 0;
  std::string attr;
  if (by_attr) {
    if (a.pos.empty()) throw ValueError("missing attribute name");
    attr = to_str(a.pos[k++]);
  }
  std::string test_name = k < a.pos.size() ? to_str(a.pos[k++]) : "";
  if (!test_name.empty() && !find_test(test_name)) throw ValueError(str("unsupported test '", test_name, "'"));
  Args targs;
  targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(std::min(k, a.pos.size())), a.pos.end());
  List out;
  for (auto& x : r.iterate(v, at)) {
    Value subject = by_attr ? attr_path(x, attr, r, at) : x;
    bool pass = test_name.empty() ? truthy(subject) : run_test(test_name, subject, targs, r, at);
    if (pass == keep_if) out.push_back(x);
  }
  return Value::make_list(std::move(out));
}

Value f_map(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  if (!truthy(v)) return Value::make_list();  // jinja2 iterates only `if value`
  List out;
  if (const Value* attr = a.get(99, "attribute")) {
    const Value* dflt = a.get(99, "default");
    for (auto& x : r.iterate(v, at)) {
      Value y = attr_path(x, to_str(*attr), r, at);
      out.push_back(y.is_undefined() && dflt ? *dflt : y);
    }
    return Value::make_list(std::move(out));
  }
  if (a.pos.empty()) throw ValueError("map: expected a filter name or attribute=");
  std::string fname = to_str(a.pos[0]);
  if (!find_filter(fname) || fname == "map") throw ValueError(str("unsupported filter '", fname, "'"));
  Args fargs;
  fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
  fargs.kw = a.kw;
  for (auto& x : r.iterate(v, at)) out.push_back(apply_filter(fname, x, fargs, r, at));
  return Value::make_list(std::move(out));
}

Value f_attr(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  return r.get_attr(v, to_str(need_str(a.get(0, "name"), "attr")), at);
}

Value f_indent(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  if (!v.is_str()) throw ValueError(str("unsupported operand type(s) for +=: '", type_name(v), "' and 'str'"));
  const Value* w = a.get(0, "width");
  std::string pad = w && w->is_str() ? w->s : std::string(static_cast<size_t>(std::clamp<int64_t>(int_arg(w, 4, "indent"), 0, 1000)), ' ');
  bool first = a.get(1, "first") && truthy(*a.get(1, "first"));
  bool blank = a.get(2, "blank") && truthy(*a.get(2, "blank"));
  std::string s = to_str(v), out;
  size_t i = 0;
  bool at_first = true;
  while (true) {
    size_t j = s.find('\n', i);
    std::string line = s.substr(i, j == std::string::npos ? std::string::npos : j - i);
    bool indent_it = at_first ? first : (blank || !line.empty());
    if (indent_it) out += pad;
    out += line;
    if (j == std::string::npos) break;
    out += '\n';
    i = j + 1;
    at_first = false;
  }
  return Value::str(out);
}

// jinja2 counts \w+ runs.
Value f_wordcount(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  std::string s = to_str(v);
  int64_t n = 0;
  bool in_word = false;
  for_each_codepoint(s, [&](const CodePoint& c) {
    bool w = c.valid && (c.cp == '_' || unicode::is_letter(c.cp) || unicode::is_number(c.cp));
    if (w && !in_word) ++n;
    in_word = w;
  });
  return Value::integer(n);
}

// ---- tests ----

const Value& test_arg(const std::string& name, const Args& a, Renderer& r, Pos at) {
  if (a.pos.empty()) r.fail(at, str("test '", name, "' needs an argument"));
  return a.pos[0];
}

bool t_defined(const std::string&, const Value& v, const Args&, Renderer&, Pos) { return !v.is_undefined(); }
bool t_undefined(const std::string&, const Value& v, const Args&, Renderer&, Pos) { return v.is_undefined(); }
bool t_none(const std::string&, const Value& v, const Args&, Renderer&, Pos) { return v.is_none(); }
bool t_boolean(const std::string&, const Value& v, const Args&, Renderer&, Pos) { return v.t == Value::T::kBool; }
bool t_true(const std::string&, const Value& v, const Args&, Renderer&, Pos) { return v.t == Value::T::kBool && v.b; }
bool t_false(const std::string&, const Value& v, const Args&, Renderer&, Pos) { return v.t == Value::T::kBool && !v.b; }
bool t_integer(const std::string&, const Value& v, const Args&, Renderer&, Pos) { return v.t == Value::T::kInt; }
bool t_float(const std::string&, const Value& v, const Args&, Renderer&, Pos) { return v.t == Value::T::kFloat; }
bool t_number(const std::string&, const Value& v, const Args&, Renderer&, Pos) { return v.is_number(); }
bool t_string(const std::string&, const Value& v, const Args&, Renderer&, Pos) { return v.is_str(); }
bool t_mapping(const std::string&, const Value& v, const Args&, Renderer&, Pos) { return v.is_dict(); }
// iterable and sequence.
bool t_iterable(const std::string&, const Value& v, const Args&, Renderer&, Pos) {
  return v.is_str() || v.is_list() || v.is_dict() || v.is_undefined();
}
bool t_callable(const std::string&, const Value& v, const Args&, Renderer&, Pos) {
  return v.t == Value::T::kFunc || v.is_undefined();  // Undefined has __call__
}
bool t_escaped(const std::string&, const Value&, const Args&, Renderer&, Pos) { return false; }

// lower / upper: str(value).islower() / .isupper(): some cased character, none of the other case.
bool t_lower_upper(const std::string& name, const Value& v, const Args&, Renderer&, Pos) {
  Args none;
  std::string method = name == "lower" ? "islower" : "isupper";
  return find_str_method(method)(to_str(v), method, none).b;
}

// even, odd, divisibleby. jinja2: value % 2 == 0, value % 2 == 1, value % num == 0.
bool t_divisible(const std::string& name, const Value& v, const Args& a, Renderer& r, Pos at) {
  Value divisor = name == "divisibleby" ? test_arg(name, a, r, at) : Value::integer(2);
  Value rem = r.binary("%", v, divisor, at);
  return equal(rem, Value::integer(name == "odd" ? 1 : 0));
}

bool t_eq(const std::string& name, const Value& v, const Args& a, Renderer& r, Pos at) {
  return equal(v, test_arg(name, a, r, at));
}
bool t_ne(const std::string& name, const Value& v, const Args& a, Renderer& r, Pos at) {
  return !equal(v, test_arg(name, a, r, at));
}
// lt, le, gt, ge and their operator spellings; in.
bool t_compare(const std::string& name, const Value& v, const Args& a, Renderer& r, Pos at) {
  static const std::map<std::string, std::string, std::less<>> kOps = {
      {"lt", "<"}, {"<", "<"}, {"le", "<="}, {"<=", "<="}, {"gt", ">"},
      {">", ">"}, {"ge", ">="}, {">=", ">="}, {"in", "in"}};
  return r.compare(kOps.at(name), v, test_arg(name, a, r, at), at);
}

bool t_sameas(const std::string& name, const Value& v, const Args& a, Renderer& r, Pos at) {
  const Value& o = test_arg(name, a, r, at);
  if (v.t != o.t) return false;
  switch (v.t) {
    case Value::T::kNone:
    case Value::T::kUndefined: return true;
    case Value::T::kBool: return v.b == o.b;
    case Value::T::kList: return v.list == o.list;
    case Value::T::kDict:
    case Value::T::kNamespace: return v.dict == o.dict;
    case Value::T::kFunc: return v.fn == o.fn;
    default: return false;  // small ints / strings: identity is an implementation detail
  }
}

// jinja2's `filter` and `test` tests are accepted by the parser but not supported.
bool t_unsupported(const std::string& name, const Value&, const Args&, Renderer& r, Pos at) {
  r.fail(at, str("unsupported construct: test '", name, "'"));
}

// ---- globals ----

Value g_range(Args& a) {
    int64_t start = 0, stop, step = 1;
    if (a.pos.size() == 1) {
      stop = int_arg(&a.pos[0], 0, "range");
    } else if (a.pos.size() >= 2) {
      start = int_arg(&a.pos[0], 0, "range");
      stop = int_arg(&a.pos[1], 0, "range");
      if (a.pos.size() > 2) step = int_arg(&a.pos[2], 1, "range");
    } else {
      throw ValueError("range expected at least 1 argument");
    }
    if (step == 0) throw ValueError("range() arg 3 must not be zero");
    List out;
    for (int64_t k = start; step > 0 ? k < stop : k > stop;) {
      out.push_back(Value::integer(k));
      if (out.size() > 100000) throw ValueError("range too large");
      if (__builtin_add_overflow(k, step, &k)) break;
    }
    return Value::make_list(std::move(out));
}

Value g_namespace(Args& a) {
  Value ns = Value::make_namespace();
  for (auto& p : a.pos) {
    if (!p.is_dict()) throw ValueError("namespace() takes a mapping or keyword arguments");
    for (auto& kv : p.dict->items) ns.dict->set(kv.first, kv.second);
  }
  for (auto& [k, v] : a.kw) ns.dict->set(k, v);
  return ns;
}

Value g_dict(Args& a) {
  Value d = Value::make_dict();
  for (auto& [k, v] : a.kw) d.dict->set(k, v);
  return d;
}

Value g_raise_exception(Args& a) {
  throw ValueError(a.pos.empty() ? std::string("raise_exception") : to_str(a.pos[0]));
}

Value g_strftime_now(Args& a) {
  if (a.pos.empty() || !a.pos[0].is_str()) throw ValueError("strftime_now expects a format string");
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[256];
  size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
  return Value::str(std::string(buf, n));
}

// ---- the tables ----

const std::map<std::string, FilterFn, std::less<>> kFilters = {
    {"abs", f_abs},         {"attr", f_attr},         {"capitalize", f_capitalize}, {"count", f_length},
    {"d", f_default},       {"default", f_default},   {"dictsort", f_dictsort},     {"e", f_escape},
    {"escape", f_escape},   {"first", f_first_last},  {"float", f_float},           {"indent", f_indent},
    {"int", f_int},         {"items", f_items},       {"join", f_join},             {"last", f_first_last},
    {"length", f_length},   {"list", f_list},         {"lower", f_lower},           {"map", f_map},
    {"max", f_min_max_sum}, {"min", f_min_max_sum},   {"reject", f_select},         {"rejectattr", f_select},
    {"replace", f_replace}, {"reverse", f_reverse},   {"round", f_round},           {"safe", f_safe},
    {"select", f_select},   {"selectattr", f_select}, {"sort", f_sort},             {"string", f_string},
    {"sum", f_min_max_sum}, {"title", f_title},       {"tojson", f_tojson},         {"trim", f_trim},
    {"unique", f_unique},   {"upper", f_upper},       {"wordcount", f_wordcount}};

const std::map<std::string, TestFn, std::less<>> kTests = {
    {"boolean", t_boolean},   {"callable", t_callable},    {"defined", t_defined},   {"divisibleby", t_divisible},
    {"eq", t_eq},             {"equalto", t_eq},           {"escaped", t_escaped},   {"even", t_divisible},
    {"false", t_false},       {"filter", t_unsupported},   {"float", t_float},       {"ge", t_compare},
    {"gt", t_compare},        {"in", t_compare},           {"integer", t_integer},   {"iterable", t_iterable},
    {"le", t_compare},        {"lower", t_lower_upper},    {"lt", t_compare},        {"mapping", t_mapping},
    {"ne", t_ne},             {"none", t_none},            {"number", t_number},     {"odd", t_divisible},
    {"sameas", t_sameas},     {"sequence", t_iterable},    {"string", t_string},     {"test", t_unsupported},
    {"true", t_true},         {"undefined", t_undefined},  {"upper", t_lower_upper}, {"==", t_eq},
    {"!=", t_ne},             {"<", t_compare},            {"<=", t_compare},        {">", t_compare},
    {">=", t_compare}};

const std::pair<const char*, Value (*)(Args&)> kGlobals[] = {
    {"range", g_range},
    {"namespace", g_namespace},
    {"dict", g_dict},
    {"raise_exception", g_raise_exception},
    {"strftime_now", g_strftime_now}};

}  // namespace

FilterFn find_filter(std::string_view name) {
  auto it = kFilters.find(name);
  return it == kFilters.end() ? nullptr : it->second;
}

TestFn find_test(std::string_view name) {
  auto it = kTests.find(name);
  return it == kTests.end() ? nullptr : it->second;
}

Value apply_filter(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  FilterFn f = find_filter(name);
  if (!f) throw ValueError(str("unsupported filter '", name, "'"));
  return f(name, v, a, r, at);
}

bool run_test(const std::string& name, const Value& v, const Args& a, Renderer& r, Pos at) {
  TestFn t = find_test(name);
  if (!t) r.fail(at, str("unsupported construct: test '", name, "'"));
  return t(name, v, a, r, at);
}

void add_globals(Dict& globals) {
  for (const auto& [name, fn] : kGlobals) globals.set(name, Value::func(fn));
}

}  // namespace rpg::jinja
