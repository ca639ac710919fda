#include "rpg/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "rpg/core/error.h"
#include "rpg/core/text.h"
#include "rpg/core/unicode.h"

namespace rpg::jinja {

Value Value::make_list(List items) {
  Value v = with(T::kList);
  v.list = std::make_shared<List>(std::move(items));
  return v;
}
Value Value::make_dict() {
  Value v = with(T::kDict);
  v.dict = std::make_shared<Dict>();
  return v;
}
Value Value::make_namespace() {
  Value v = with(T::kNamespace);
  v.dict = std::make_shared<Dict>();
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null: return none();
    case nlohmann::ordered_json::value_t::boolean: return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: return real(j.get<double>());
    case nlohmann::ordered_json::value_t::string: return str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List items;
      items.reserve(j.size());
      for (auto& e : j) items.push_back(from_json(e));
      return make_list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = make_dict();
      for (auto it = j.begin(); it != j.end(); ++it) d.dict->items.emplace_back(it.key(), from_json(it.value()));
      return d;
    }
    default: throw ValueError("chat template variables: unsupported JSON value");
  }
}

bool truthy(const Value& v) {
  switch (v.t) {
    case Value::T::kUndefined:
    case Value::T::kNone: return false;
    case Value::T::kBool: return v.b;
    case Value::T::kInt: return v.i != 0;
    case Value::T::kFloat: return v.f != 0;
    case Value::T::kStr: return !v.s.empty();
    case Value::T::kList: return !v.list->empty();
    case Value::T::kDict: return !v.dict->items.empty();
    default: return true;
  }
}

bool equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.t != Value::T::kFloat && b.t != Value::T::kFloat)
      return (a.t == Value::T::kBool ? a.b : a.i) == (b.t == Value::T::kBool ? b.b : b.i);
    return a.as_double() == b.as_double();
  }
  if (a.t != b.t) return false;
  switch (a.t) {
    case Value::T::kUndefined:
    case Value::T::kNone: return true;
    case Value::T::kStr: return a.s == b.s;
    case Value::T::kList:
      if (a.list->size() != b.list->size()) return false;
      for (size_t k = 0; k < a.list->size(); ++k)
        if (!equal((*a.list)[k], (*b.list)[k])) return false;
      return true;
    case Value::T::kDict: {
      if (a.dict->items.size() != b.dict->items.size()) return false;
      for (auto& [k, v] : a.dict->items) {
        const Value* o = b.dict->find(k);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    }
    default: return a.dict == b.dict && a.fn == b.fn;  // identity
  }
}

std::string float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  // sci = [-]D[.DDD]e[+-]XX
  bool neg = sci[0] == '-';
  if (neg) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exp = std::stoi(sci.substr(e + 1));
  std::string out;
  if (exp >= -5 + 1 && exp < 16) {
    // Fixed notation, as Python's repr for 1e-4 <= |d| < 1e16.
    if (exp >= 0) {
      if (digits.size() <= static_cast<size_t>(exp) + 1) {
        out = digits + std::string(static_cast<size_t>(exp) + 1 - digits.size(), '0') + ".0";
      } else {
        out = digits.substr(0, static_cast<size_t>(exp) + 1) + "." + digits.substr(static_cast<size_t>(exp) + 1);
      }
    } else {
      out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
    }
  } else {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  }
  return neg ? "-" + out : out;
}

const char* type_name(const Value& v) {
  switch (v.t) {
    case Value::T::kUndefined: return "Undefined";
    case Value::T::kNone: return "NoneType";
    case Value::T::kBool: return "bool";
    case Value::T::kInt: return "int";
    case Value::T::kFloat: return "float";
    case Value::T::kStr: return "str";
    case Value::T::kList: return "list";
    case Value::T::kDict: return "dict";
    case Value::T::kNamespace: return "Namespace";
    default: return "function";
  }
}

namespace {

bool py_printable(char32_t c) {
  // Python's str.isprintable() for repr: no control, separator (other than space) or
  // unassigned characters.
  if (c < 0x20 || c == 0x7f) return false;
  if (c < 0x7f) return true;
  if (c >= 0x80 && c < 0xa0) return false;
  if (c == 0xad) return false;
  if (unicode::is_space(c) && c != ' ') return false;
  if (c >= 0xd800 && c <= 0xdfff) return false;
  if ((c >= 0x200b && c <= 0x200f) || (c >= 0x2028 && c <= 0x202e) || (c >= 0x2060 && c <= 0x206f) ||
      c == 0xfeff || (c >= 0xfff9 && c <= 0xfffb))
    return false;
  return true;
}

std::string str_repr(const std::string& s) {
  bool has_sq = s.find('\'') != std::string::npos, has_dq = s.find('"') != std::string::npos;
  char q = has_sq && !has_dq ? '"' : '\'';
  std::string out(1, q);
  for_each_codepoint(s, [&](const CodePoint& cp) {
    char32_t c = cp.cp;
    if (c == static_cast<char32_t>(q) || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (!py_printable(c)) {
      char buf[16];
      if (c < 0x100) std::snprintf(buf, sizeof buf, "\\x%02x", static_cast<unsigned>(c));
      else if (c < 0x10000) std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      else std::snprintf(buf, sizeof buf, "\\U%08x", static_cast<unsigned>(c));
      out += buf;
    } else {
      out.append(s, cp.pos, cp.len);  // ill-formed bytes stay as they are
    }
  });
  out += q;
  return out;
}

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for_each_codepoint(s, [&](const CodePoint& cp) {
    char32_t c = cp.cp;
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default: {
        char buf[16];
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
          if (c < 0x10000) {
            std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
            out += buf;
          } else {
            char32_t v = c - 0x10000;
            std::snprintf(buf, sizeof buf, "\\u%04x\\u%04x", static_cast<unsigned>(0xd800 + (v >> 10)),
                          static_cast<unsigned>(0xdc00 + (v & 0x3ff)));
            out += buf;
          }
        } else {
          out.append(s, cp.pos, cp.len);
        }
      }
    }
  });
  out += '"';
}

void json_dump(std::string& out, const Value& v, bool ensure_ascii, int indent, int depth, const std::string& item_sep,
               const std::string& key_sep, bool sort_keys) {
  auto newline = [&](int d) {
    if (indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  switch (v.t) {
    case Value::T::kNone: out += "null"; break;
    case Value::T::kBool: out += v.b ? "true" : "false"; break;
    case Value::T::kInt: out += std::to_string(v.i); break;
    case Value::T::kFloat:
      if (std::isnan(v.f)) out += "NaN";
      else if (std::isinf(v.f)) out += v.f > 0 ? "Infinity" : "-Infinity";
      else out += float_repr(v.f);
      break;
    case Value::T::kStr: json_string(out, v.s, ensure_ascii); break;
    case Value::T::kList: {
      if (v.list->empty()) {
        out += "[]";
        break;
      }
      out += '[';
      bool first = true;
      for (auto& e : *v.list) {
        if (!first) out += item_sep;
        first = false;
        newline(depth + 1);
        json_dump(out, e, ensure_ascii, indent, depth + 1, item_sep, key_sep, sort_keys);
      }
      newline(depth);
      out += ']';
      break;
    }
    case Value::T::kDict: {
      if (v.dict->items.empty()) {
        out += "{}";
        break;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (auto& kv : v.dict->items) items.push_back(&kv);
      if (sort_keys) std::stable_sort(items.begin(), items.end(), [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      bool first = true;
      for (auto* kv : items) {
        if (!first) out += item_sep;
        first = false;
        newline(depth + 1);
        json_string(out, kv->first, ensure_ascii);
        out += key_sep;
        json_dump(out, kv->second, ensure_ascii, indent, depth + 1, item_sep, key_sep, sort_keys);
      }
      newline(depth);
      out += '}';
      break;
    }
    default: throw ValueError(str("Object of type ", type_name(v), " is not JSON serializable"));
  }
}

}  // namespace

std::string repr(const Value& v) {
  switch (v.t) {
    case Value::T::kStr: return str_repr(v.s);
    case Value::T::kUndefined: return "Undefined";
    default: return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.t) {
    case Value::T::kUndefined: return "";
    case Value::T::kNone: return "None";
    case Value::T::kBool: return v.b ? "True" : "False";
    case Value::T::kInt: return std::to_string(v.i);
    case Value::T::kFloat: return float_repr(v.f);
    case Value::T::kStr: return v.s;
    case Value::T::kList: {
      std::string out = v.tuple ? "(" : "[";
      for (size_t k = 0; k < v.list->size(); ++k) {
        if (k) out += ", ";
        out += repr((*v.list)[k]);
      }
      if (v.tuple && v.list->size() == 1) out += ",";
      return out + (v.tuple ? ")" : "]");
    }
    case Value::T::kDict: {
      std::string out = "{";
      bool first = true;
      for (auto& [key, val] : v.dict->items) {
        if (!first) out += ", ";
        first = false;
        out += str_repr(key) + ": " + repr(val);
      }
      return out + "}";
    }
    case Value::T::kNamespace: return "<Namespace>";
    default: return "<function>";
  }
}

std::string to_json(const Value& v, bool ensure_ascii, int indent, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys) {
  std::string out;
  json_dump(out, v, ensure_ascii, indent, 0, item_sep, key_sep, sort_keys);
  return out;
}

bool py_space(char32_t c) { return (c >= 0x1c && c <= 0x1f) || unicode::is_space(c); }

size_t cp_count(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += !is_utf8_continuation(c);
  return n;
}

std::vector<size_t> cp_offsets(const std::string& s) {
  std::vector<size_t> off;
  for (size_t i = 0; i < s.size(); ++i)
    if (!is_utf8_continuation(static_cast<unsigned char>(s[i]))) off.push_back(i);
  off.push_back(s.size());
  return off;
}

}  // namespace rpg::jinja
