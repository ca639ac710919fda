// Python str semantics for the chat-template engine: the str methods templates call
// (message.content.strip(), .split(), .startswith(), ...) and the helpers the filters
// share with them. Strings are UTF-8; indices and lengths count code points, as Python's do.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "rpg/jinja/value.h"

namespace rpg::jinja {

// str.strip / lstrip / rstrip; `chars` null, None or undefined = whitespace.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right);
// str.split(sep, maxsplit); sep null or None = runs of whitespace. maxsplit < 0 = no limit.
List py_split(const std::string& s, const Value* sep, int64_t maxsplit);
std::string py_lower(const std::string& s);
std::string py_upper(const std::string& s);
std::string py_capitalize(const std::string& s);
std::string py_title(const std::string& s);
// str.replace(from, to, count); count < 0 = all.
std::string py_replace(const std::string& s, const std::string& from, const std::string& to, int64_t count);

// Argument checks shared by str methods and filters; `what` names the callee in errors.
const Value& need_str(const Value* v, const char* what);
int64_t int_arg(const Value* v, int64_t dflt, const char* what);

// The str method `name` called on `self`; `name` tells methods that share one function apart.
using StrMethod = Value (*)(const std::string& self, const std::string& name, Args& a);
// nullptr when str has no such method (or the engine does not support it).
StrMethod find_str_method(std::string_view name);

}  // namespace rpg::jinja
