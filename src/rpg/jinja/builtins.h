// Filters, tests and globals of the chat-template engine: the subset of jinja2's builtins
// (plus transformers' raise_exception, strftime_now and tojson) that chat templates use.
// Each is one entry of a name -> function table; the parser accepts exactly the names the
// tables hold, so a template using anything else fails at parse time.
#pragma once

#include <string>
#include <string_view>

#include "rpg/jinja/lexer.h"
#include "rpg/jinja/value.h"

namespace rpg::jinja {

class Renderer;

// `name` is the name the template used (several names share one function: e / escape,
// d / default, lt / <, ...). Errors are thrown as ValueError (the renderer adds the position).
using FilterFn = Value (*)(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at);
using TestFn = bool (*)(const std::string& name, const Value& v, const Args& a, Renderer& r, Pos at);

// nullptr when the engine has no filter / test of that name.
FilterFn find_filter(std::string_view name);
TestFn find_test(std::string_view name);

Value apply_filter(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at);
bool run_test(const std::string& name, const Value& v, const Args& a, Renderer& r, Pos at);

// The global functions every render starts with (range, namespace, dict,
// raise_exception, strftime_now).
void add_globals(Dict& globals);

}  // namespace rpg::jinja
