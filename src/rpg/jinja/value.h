// Values of the chat-template interpreter, with Python semantics: the templates are
// written against jinja2 running on Python objects, so truthiness, equality, str(),
// repr() and json.dumps() must behave as Python's do.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace rpg::jinja {

struct Value;
struct Dict;
struct Args;
using List = std::vector<Value>;
using Function = std::function<Value(Args&)>;

struct Value {
  enum class T : uint8_t { kUndefined, kNone, kBool, kInt, kFloat, kStr, kList, kDict, kNamespace, kFunc };
  T t = T::kUndefined;
  bool b = false;
  bool tuple = false;  // a list that prints as a Python tuple
  int64_t i = 0;
  double f = 0;
  std::string s;  // string value, or the name of an undefined variable
  std::shared_ptr<List> list;
  std::shared_ptr<Dict> dict;  // also the attributes of a namespace
  std::shared_ptr<Function> fn;

  static Value undefined(std::string name = {}) {
    Value v;
    v.s = std::move(name);
    return v;
  }
  static Value none() { return with(T::kNone); }
  static Value boolean(bool x) {
    Value v = with(T::kBool);
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v = with(T::kInt);
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v = with(T::kFloat);
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v = with(T::kStr);
    v.s = std::move(x);
    return v;
  }
  static Value make_list(List items = {});
  static Value make_tuple(List items) {
    Value v = make_list(std::move(items));
    v.tuple = true;
    return v;
  }
  static Value make_dict();
  static Value make_namespace();
  static Value func(Function f) {
    Value v = with(T::kFunc);
    v.fn = std::make_shared<Function>(std::move(f));
    return v;
  }
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return t == T::kUndefined; }
  bool is_none() const { return t == T::kNone; }
  bool is_str() const { return t == T::kStr; }
  bool is_list() const { return t == T::kList; }
  bool is_dict() const { return t == T::kDict; }
  bool is_number() const { return t == T::kInt || t == T::kFloat || t == T::kBool; }
  double as_double() const { return t == T::kFloat ? f : static_cast<double>(t == T::kBool ? b : i); }

 private:
  static Value with(T t) {
    Value v;
    v.t = t;
    return v;
  }
};

// Insertion-ordered string-keyed mapping (Python dicts keep insertion order and JSON
// objects from the caller must be dumped back in their order).
struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const {
    for (auto& kv : items)
      if (kv.first == key) return &kv.second;
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& kv : items)
      if (kv.first == key) {
        kv.second = std::move(v);
        return;
      }
    items.emplace_back(key, std::move(v));
  }
};

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Python-style binding of parameter `name` at position `index`; nullptr when absent.
  const Value* get(size_t index, std::string_view name) const {
    for (auto& kv : kw)
      if (kv.first == name) return &kv.second;
    return index < pos.size() ? &pos[index] : nullptr;
  }
};

bool truthy(const Value& v);
bool equal(const Value& a, const Value& b);
// Python str(v) (an undefined value prints as nothing, as jinja's Undefined does).
std::string to_str(const Value& v);
// Python repr(v).
std::string repr(const Value& v);
// Python repr of a float: shortest round-trip digits, exponent outside [1e-4, 1e16).
std::string float_repr(double d);
// Python json.dumps(v, ensure_ascii, indent, separators, sort_keys). indent < 0 = None.
std::string to_json(const Value& v, bool ensure_ascii, int indent, const std::string& item_sep,
                    const std::string& key_sep, bool sort_keys);
const char* type_name(const Value& v);

// Python's str.isspace() for one code point: the White_Space property plus the ASCII
// separators 0x1c-0x1f.
bool py_space(char32_t c);
// Python's len() of a str, and the byte offset of each code point plus the end (for
// Python-style indexing and slicing).
size_t cp_count(const std::string& s);
std::vector<size_t> cp_offsets(const std::string& s);

}  // namespace rpg::jinja
