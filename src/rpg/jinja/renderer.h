// Renderer of the chat-template engine: walks the syntax tree with jinja2's scoping and
// Python's operator semantics. Filters, tests and globals are in builtins.h.
#pragma once

#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "rpg/core/error.h"
#include "rpg/jinja/ast.h"
#include "rpg/jinja/value.h"

namespace rpg::jinja {

// Thrown by {% break %} / {% continue %} up to the enclosing loop.
struct LoopControl {
  bool is_break;
};

// Bounds on one render, so a hostile template fails with an error instead of running
// forever or exhausting memory. Real chat templates are far below them.
constexpr uint64_t kMaxOutput = 64ull << 20;
constexpr uint64_t kMaxListItems = 1ull << 20;
constexpr uint64_t kMaxSteps = 5'000'000;
constexpr int kMaxCallDepth = 64;

class Renderer {
 public:
  explicit Renderer(const std::string& origin) : origin_(origin) {}

  [[noreturn]] void fail(Pos at, const std::string& why) const {
    throw ValueError(str(origin_, ":", at.line, ":", at.col, ": ", why));
  }

  // Scopes: the globals, the template's top level, then one frame per for loop or macro
  // call. `set` writes to the innermost frame, so assignments inside a loop do not leak
  // out of it, as in jinja2 (the reason templates use namespace()).
  std::vector<std::shared_ptr<Dict>> frames;

  // Names the template assigns at its top level. jinja2 compiles them as locals of the
  // top-level frame, so inside loops and macros they are undefined until assigned (even
  // when the caller passed a variable of that name); at the top level itself the caller's
  // value shows until then.
  // The same holds for every scope: a name a loop or macro body assigns is, seen from a
  // loop nested in it, undefined until that body has assigned it.
  const std::set<std::string>* root_stored = nullptr;
  std::set<std::string> root_assigned;
  std::vector<const std::set<std::string>*> frame_stored;  // parallel to frames; null = none

  Value lookup(const std::string& name) const;
  void push_frame(std::shared_ptr<Dict> f, const std::set<std::string>* stored);
  void set_var(const std::string& name, Value v);

  void render(const Body& body, std::string& out);

  Value eval(const Expr& e);
  // Python iteration: list items, dict keys, the characters of a string; undefined = empty.
  List iterate(const Value& v, Pos at);
  Value get_item(const Value& obj, const Value& key, Pos at);
  Value get_attr(const Value& obj, const std::string& name, Pos at);
  Value binary(const std::string& op, const Value& a, const Value& b, Pos at);
  bool compare(const std::string& op, const Value& a, const Value& b, Pos at);

 private:
  void exec(const Node& n, std::string& out);
  void exec_for(const Node& n, std::string& out);
  void assign(const std::vector<std::string>& targets, Value v, Pos at);
  Value make_macro(const Node& n);
  Args eval_args(const Expr& e, size_t first);
  Value call(const Value& fn, Args& args, Pos at);
  Value slice(const Expr& e);
  Value filter(const Expr& e);
  bool test(const Expr& e);

  uint64_t steps_ = 0;
  int call_depth_ = 0;
  const std::string& origin_;
};

}  // namespace rpg::jinja
