#include "rpg/jinja/renderer.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "rpg/core/text.h"
#include "rpg/jinja/builtins.h"
#include "rpg/jinja/pystr.h"

namespace rpg::jinja {

namespace {

const std::set<std::string, std::less<>> kDictMethods = {"items", "keys", "values", "get"};
// Methods the sandbox refuses: they would mutate the caller's objects.
const std::set<std::string, std::less<>> kMutating = {"append", "extend", "insert", "pop", "remove", "clear",
                                                      "update", "setdefault", "popitem", "sort", "reverse"};

}  // namespace

Value Renderer::lookup(const std::string& name) const {
  size_t inner = frames.size() - 1;
  for (size_t k = frames.size(); k-- > 0;) {
    if (k == 1) {
      if (k < inner && root_stored->count(name) && !root_assigned.count(name)) return Value::undefined(name);
    } else if (k < inner && k < frame_stored.size() && frame_stored[k] && frame_stored[k]->count(name) &&
               !frames[k]->find(name)) {
      return Value::undefined(name);
    }
    if (const Value* v = frames[k]->find(name)) return *v;
  }
  return Value::undefined(name);
}

void Renderer::push_frame(std::shared_ptr<Dict> f, const std::set<std::string>* stored) {
  frames.push_back(std::move(f));
  frame_stored.resize(frames.size(), nullptr);
  frame_stored.back() = stored;
}

void Renderer::set_var(const std::string& name, Value v) {
  if (frames.size() == 2) root_assigned.insert(name);
  frames.back()->set(name, std::move(v));
}

void Renderer::render(const Body& body, std::string& out) {
  for (const NodeP& n : body) {
    if (++steps_ > kMaxSteps) fail(n->at, "template exceeded the render step limit");
    exec(*n, out);
    if (out.size() > kMaxOutput) fail(n->at, "template output exceeded the size limit");
  }
}

void Renderer::exec(const Node& n, std::string& out) {
  switch (n.k) {
    case Node::K::kText: out += n.text; break;
    case Node::K::kOutput: out += to_str(eval(*n.expr)); break;
    case Node::K::kIf: {
      for (auto& [cond, body] : n.branches)
        if (truthy(eval(*cond))) {
          render(body, out);
          return;
        }
      render(n.else_body, out);
      break;
    }
    case Node::K::kFor: exec_for(n, out); break;
    case Node::K::kSet: {
      Value v = eval(*n.expr);
      if (!n.attr.empty()) {
        Value ns = lookup(n.targets[0]);
        if (ns.t != Value::T::kNamespace) fail(n.at, "cannot assign attribute on non-namespace object");
        ns.dict->set(n.attr, std::move(v));
      } else {
        assign(n.targets, std::move(v), n.at);
      }
      break;
    }
    case Node::K::kSetBlock: {
      std::string captured;
      render(n.body, captured);
      set_var(n.targets[0], Value::str(std::move(captured)));
      break;
    }
    case Node::K::kMacro: set_var(n.targets[0], make_macro(n)); break;
    case Node::K::kBreak: throw LoopControl{true};
    case Node::K::kContinue: throw LoopControl{false};
    case Node::K::kGeneration: render(n.body, out); break;
    case Node::K::kCallExpr: eval(*n.expr); break;
  }
}

void Renderer::assign(const std::vector<std::string>& targets, Value v, Pos at) {
  if (targets.size() == 1) {
    set_var(targets[0], std::move(v));
    return;
  }
  List items = iterate(v, at);
  if (items.size() != targets.size())
    fail(at, str("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
  for (size_t k = 0; k < targets.size(); ++k) set_var(targets[k], items[k]);
}

List Renderer::iterate(const Value& v, Pos at) {
  switch (v.t) {
    case Value::T::kUndefined: return {};
    case Value::T::kList: return *v.list;
    case Value::T::kDict: {
      List keys;
      for (auto& kv : v.dict->items) keys.push_back(Value::str(kv.first));
      return keys;
    }
    case Value::T::kStr: {
      List chars;
      for_each_codepoint(v.s, [&](const CodePoint& c) { chars.push_back(Value::str(v.s.substr(c.pos, c.len))); });
      return chars;
    }
    default: fail(at, str("'", type_name(v), "' object is not iterable"));
  }
}

void Renderer::exec_for(const Node& n, std::string& out) {
  List items = iterate(eval(*n.expr), n.at);
  auto frame = std::make_shared<Dict>();
  push_frame(frame, &n.stored);
  struct Pop {
    Renderer* r;
    ~Pop() { r->frames.pop_back(); }
  } pop{this};
  if (n.cond) {
    // `for x in xs if cond`: the filter sees the loop variable but not `loop`.
    List kept;
    for (auto& it : items) {
      assign(n.targets, it, n.at);
      if (truthy(eval(*n.cond))) kept.push_back(it);
    }
    items = std::move(kept);
  }
  if (items.empty()) {
    render(n.else_body, out);
    return;
  }
  int64_t len = static_cast<int64_t>(items.size());
  for (int64_t k = 0; k < len; ++k) {
    if (++steps_ > kMaxSteps) fail(n.at, "template exceeded the render step limit");
    // jinja2 starts every iteration from the enclosing scope: assignments made in the
    // body do not carry over to the next iteration.
    frame->items.clear();
    assign(n.targets, items[static_cast<size_t>(k)], n.at);
    Value loop = Value::make_dict();
    auto& d = *loop.dict;
    d.items.reserve(12);
    d.items.emplace_back("index", Value::integer(k + 1));
    d.items.emplace_back("index0", Value::integer(k));
    d.items.emplace_back("revindex", Value::integer(len - k));
    d.items.emplace_back("revindex0", Value::integer(len - k - 1));
    d.items.emplace_back("first", Value::boolean(k == 0));
    d.items.emplace_back("last", Value::boolean(k == len - 1));
    d.items.emplace_back("length", Value::integer(len));
    d.items.emplace_back("depth", Value::integer(1));
    d.items.emplace_back("depth0", Value::integer(0));
    d.items.emplace_back("previtem", k > 0 ? items[static_cast<size_t>(k - 1)] : Value::undefined("previtem"));
    d.items.emplace_back("nextitem", k + 1 < len ? items[static_cast<size_t>(k + 1)] : Value::undefined("nextitem"));
    d.items.emplace_back("cycle", Value::func([k](Args& a) -> Value {
      if (a.pos.empty()) throw ValueError("loop.cycle: no items given");
      return a.pos[static_cast<size_t>(k) % a.pos.size()];
    }));
    frame->set("loop", loop);
    try {
      render(n.body, out);
    } catch (const LoopControl& c) {
      if (c.is_break) break;
    }
  }
}

Value Renderer::make_macro(const Node& n) {
  const Node* node = &n;
  return Value::func([this, node](Args& a) -> Value {
    auto frame = std::make_shared<Dict>();
    for (size_t k = 0; k < node->params.size(); ++k) {
      const auto& [pname, dflt] = node->params[k];
      const Value* v = a.get(k, pname);
      frame->set(pname, v ? *v : dflt ? eval(*dflt) : Value::undefined(pname));
    }
    if (a.pos.size() > node->params.size()) fail(node->at, str("macro '", node->targets[0], "' takes at most ", node->params.size(), " arguments"));
    if (call_depth_ >= kMaxCallDepth) fail(node->at, "macro recursion too deep");
    struct DepthGuard {
      int& d;
      ~DepthGuard() { --d; }
    } depth_guard{++call_depth_};
    // A macro sees the template's top-level names, not the caller's loop variables.
    std::vector<std::shared_ptr<Dict>> saved;
    std::vector<const std::set<std::string>*> saved_stored = frame_stored;
    saved.swap(frames);
    frames.assign(saved.begin(), saved.begin() + 2);  // globals and template top level
    push_frame(frame, &node->stored);
    std::string out;
    try {
      render(node->body, out);
    } catch (...) {
      frames.swap(saved);
      frame_stored = saved_stored;
      throw;
    }
    frames.swap(saved);
    frame_stored = saved_stored;
    return Value::str(std::move(out));
  });
}

Value Renderer::eval(const Expr& e) {
  switch (e.k) {
    case Expr::K::kLiteral: return e.literal;
    case Expr::K::kName: return lookup(e.name);
    case Expr::K::kAttr: return get_attr(eval(*e.kids[0]), e.name, e.at);
    case Expr::K::kItem: return get_item(eval(*e.kids[0]), eval(*e.kids[1]), e.at);
    case Expr::K::kSlice: return slice(e);
    case Expr::K::kCall: {
      Value fn = eval(*e.kids[0]);
      Args args = eval_args(e, 1);
      if (fn.t != Value::T::kFunc) {
        if (fn.is_undefined()) fail(e.at, str("'", fn.s, "' is undefined"));
        fail(e.at, str("'", type_name(fn), "' object is not callable"));
      }
      return call(fn, args, e.at);
    }
    case Expr::K::kFilter: return filter(e);
    case Expr::K::kTest: {
      bool r = test(e);
      return Value::boolean(e.negated ? !r : r);
    }
    case Expr::K::kNot: return Value::boolean(!truthy(eval(*e.kids[0])));
    case Expr::K::kNeg:
    case Expr::K::kPos: {
      Value v = eval(*e.kids[0]);
      if (v.t == Value::T::kBool) v = Value::integer(v.b);
      if (v.t == Value::T::kInt) {
        if (e.k == Expr::K::kNeg && v.i == INT64_MIN) fail(e.at, "integer overflow");
        return e.k == Expr::K::kNeg ? Value::integer(-v.i) : v;
      }
      if (v.t == Value::T::kFloat) return e.k == Expr::K::kNeg ? Value::real(-v.f) : v;
      fail(e.at, str("bad operand type for unary ", e.k == Expr::K::kNeg ? "-" : "+", ": '", type_name(v), "'"));
    }
    case Expr::K::kAnd: {
      Value a = eval(*e.kids[0]);
      return truthy(a) ? eval(*e.kids[1]) : a;
    }
    case Expr::K::kOr: {
      Value a = eval(*e.kids[0]);
      return truthy(a) ? a : eval(*e.kids[1]);
    }
    case Expr::K::kBin: return binary(e.name, eval(*e.kids[0]), eval(*e.kids[1]), e.at);
    case Expr::K::kCompare: {
      Value left = eval(*e.kids[0]);
      for (size_t k = 0; k < e.ops.size(); ++k) {
        Value right = eval(*e.kids[k + 1]);
        if (!compare(e.ops[k], left, right, e.at)) return Value::boolean(false);
        left = std::move(right);
      }
      return Value::boolean(true);
    }
    case Expr::K::kCond: {
      if (truthy(eval(*e.kids[0]))) return eval(*e.kids[1]);
      return e.kids[2] ? eval(*e.kids[2]) : Value::undefined();
    }
    case Expr::K::kList:
    case Expr::K::kTuple: {
      List items;
      for (auto& k : e.kids) items.push_back(eval(*k));
      return e.k == Expr::K::kTuple ? Value::make_tuple(std::move(items)) : Value::make_list(std::move(items));
    }
    case Expr::K::kDict: {
      Value d = Value::make_dict();
      for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
        Value key = eval(*e.kids[k]);
        if (!key.is_str()) fail(e.at, "unsupported construct: dict literal with a non-string key");
        d.dict->set(key.s, eval(*e.kids[k + 1]));
      }
      return d;
    }
  }
  fail(e.at, "bad expression");
}

Args Renderer::eval_args(const Expr& e, size_t first) {
  Args a;
  size_t n_kw = e.kw_names.size();
  size_t n_pos = e.kids.size() - first - n_kw;
  for (size_t k = 0; k < n_pos; ++k) a.pos.push_back(eval(*e.kids[first + k]));
  for (size_t k = 0; k < n_kw; ++k) a.kw.emplace_back(e.kw_names[k], eval(*e.kids[first + n_pos + k]));
  return a;
}

Value Renderer::call(const Value& fn, Args& args, Pos at) {
  try {
    return (*fn.fn)(args);
  } catch (const LoopControl&) {
    throw;
  } catch (const ValueError& err) {
    std::string msg = err.what();
    if (msg.rfind(origin_, 0) == 0) throw;  // already located
    fail(at, msg);
  }
}

Value Renderer::get_item(const Value& obj, const Value& key, Pos at) {
  switch (obj.t) {
    case Value::T::kUndefined: fail(at, str("'", obj.s, "' is undefined"));
    case Value::T::kList:
    case Value::T::kStr: {
      if (key.t != Value::T::kInt && key.t != Value::T::kBool) {
        if (obj.is_str() && key.is_str()) return get_attr(obj, key.s, at);
        return Value::undefined();
      }
      int64_t idx = key.t == Value::T::kBool ? key.b : key.i;
      if (obj.is_list()) {
        int64_t n = static_cast<int64_t>(obj.list->size());
        if (idx < 0) idx += n;
        if (idx < 0 || idx >= n) return Value::undefined();
        return (*obj.list)[static_cast<size_t>(idx)];
      }
      auto off = cp_offsets(obj.s);
      int64_t n = static_cast<int64_t>(off.size()) - 1;
      if (idx < 0) idx += n;
      if (idx < 0 || idx >= n) return Value::undefined();
      return Value::str(obj.s.substr(off[static_cast<size_t>(idx)], off[static_cast<size_t>(idx) + 1] - off[static_cast<size_t>(idx)]));
    }
    case Value::T::kDict:
    case Value::T::kNamespace:
      if (key.is_str()) {
        if (const Value* v = obj.dict->find(key.s)) return *v;
        if (obj.t == Value::T::kDict) return get_attr(obj, key.s, at);
      }
      return Value::undefined();
    default: return Value::undefined();
  }
}

Value Renderer::get_attr(const Value& obj, const std::string& name, Pos at) {
  switch (obj.t) {
    case Value::T::kUndefined:
      fail(at, str("'", obj.s.empty() ? "value" : obj.s, "' is undefined (accessing attribute '", name, "')"));
    case Value::T::kStr:
      if (StrMethod method = find_str_method(name)) {
        Value self = obj;
        return Value::func([self, name, method](Args& a) { return method(self.s, name, a); });
      }
      return Value::undefined(name);
    case Value::T::kDict:
      if (kDictMethods.count(name)) {
        Value self = obj;
        return Value::func([self, name](Args& a) -> Value {
          if (name == "get") {
            const Value* k = a.get(0, "key");
            const Value* d = a.get(1, "default");
            if (k && k->is_str())
              if (const Value* v = self.dict->find(k->s)) return *v;
            return d ? *d : Value::none();
          }
          List out;
          for (auto& [k, v] : self.dict->items) {
            if (name == "keys") out.push_back(Value::str(k));
            else if (name == "values") out.push_back(v);
            else out.push_back(Value::make_tuple({Value::str(k), v}));
          }
          return Value::make_list(std::move(out));
        });
      }
      if (kMutating.count(name)) fail(at, str("access to attribute '", name, "' of 'dict' object is unsafe"));
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined(name);
    case Value::T::kNamespace:
      if (const Value* v = obj.dict->find(name)) return *v;
      return Value::undefined(name);
    case Value::T::kList:
      if (kMutating.count(name)) fail(at, str("access to attribute '", name, "' of 'list' object is unsafe"));
      if (name == "count" || name == "index") {
        Value self = obj;
        return Value::func([self, name](Args& a) -> Value {
          if (a.pos.empty()) throw ValueError(str(name, "() takes exactly one argument"));
          int64_t n = 0;
          for (size_t k = 0; k < self.list->size(); ++k) {
            if (!equal((*self.list)[k], a.pos[0])) continue;
            if (name == "index") return Value::integer(static_cast<int64_t>(k));
            ++n;
          }
          if (name == "index") throw ValueError("value is not in list");
          return Value::integer(n);
        });
      }
      return Value::undefined(name);
    default: return Value::undefined(name);
  }
}

Value Renderer::slice(const Expr& e) {
  Value obj = eval(*e.kids[0]);
  auto bound = [&](size_t k) -> std::optional<int64_t> {
    if (!e.kids[k]) return std::nullopt;
    Value v = eval(*e.kids[k]);
    if (v.is_none()) return std::nullopt;
    if (v.t == Value::T::kInt) return v.i;
    if (v.t == Value::T::kBool) return v.b;
    fail(e.at, "slice indices must be integers or None");
  };
  auto start = bound(1), stop = bound(2), step_o = bound(3);
  int64_t step = step_o.value_or(1);
  if (step == 0) fail(e.at, "slice step cannot be zero");
  if (obj.is_undefined()) fail(e.at, str("'", obj.s, "' is undefined"));
  size_t n;
  std::vector<size_t> off;
  if (obj.is_list()) {
    n = obj.list->size();
  } else if (obj.is_str()) {
    off = cp_offsets(obj.s);
    n = off.size() - 1;
  } else {
    fail(e.at, str("'", type_name(obj), "' object is not subscriptable"));
  }
  // Python's slice.indices().
  int64_t len = static_cast<int64_t>(n);
  auto clamp = [&](std::optional<int64_t> v, int64_t dflt) {
    if (!v) return dflt;
    int64_t x = *v;
    if (x < 0) x += len;
    if (step > 0) return std::clamp<int64_t>(x, 0, len);
    return std::clamp<int64_t>(x, -1, len - 1);
  };
  int64_t b = clamp(start, step > 0 ? 0 : len - 1), en = clamp(stop, step > 0 ? len : -1);
  List items;
  std::string s;
  for (int64_t k = b; step > 0 ? k < en : k > en;) {
    if (obj.is_list()) items.push_back((*obj.list)[static_cast<size_t>(k)]);
    else s.append(obj.s, off[static_cast<size_t>(k)], off[static_cast<size_t>(k) + 1] - off[static_cast<size_t>(k)]);
    if (__builtin_add_overflow(k, step, &k)) break;
  }
  return obj.is_list() ? Value::make_list(std::move(items)) : Value::str(std::move(s));
}

Value Renderer::binary(const std::string& op, const Value& a, const Value& b, Pos at) {
  if (op == "~") {
    std::string r = to_str(a) + to_str(b);
    if (r.size() > kMaxOutput) fail(at, "string too large");
    return Value::str(std::move(r));
  }
  auto bad_types = [&]() {
    fail(at, str("unsupported operand type(s) for ", op, ": '", type_name(a), "' and '", type_name(b), "'"));
  };
  if (op == "%" && a.is_str()) {
    if (a.s.find('%') != std::string::npos) fail(at, "unsupported construct: printf-style string formatting");
    // No specifiers: Python returns the string for a mapping-like right side (dict, list)
    // or an empty tuple, and complains about unconverted arguments otherwise.
    if (b.is_dict() || b.is_undefined() || (b.is_list() && (!b.tuple || b.list->empty()))) return a;
    fail(at, "not all arguments converted during string formatting");
  }
  if (a.is_undefined() || b.is_undefined()) {
    if (op == "+" && (a.is_str() || b.is_str() || a.is_undefined() || b.is_undefined()))
      fail(at, str("'", a.is_undefined() ? a.s : b.s, "' is undefined"));
    bad_types();
  }
  if (op == "+") {
    if (a.is_str() && b.is_str()) {
      if (a.s.size() + b.s.size() > kMaxOutput) fail(at, "string too large");
      return Value::str(a.s + b.s);
    }
    if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
      if (a.list->size() + b.list->size() > kMaxListItems) fail(at, "list too large");
      List items = *a.list;
      items.insert(items.end(), b.list->begin(), b.list->end());
      return a.tuple ? Value::make_tuple(std::move(items)) : Value::make_list(std::move(items));
    }
  }
  if (op == "*") {
    const Value* seq = a.is_str() || a.is_list() ? &a : b.is_str() || b.is_list() ? &b : nullptr;
    const Value* cnt = seq == &a ? &b : &a;
    if (seq && (cnt->t == Value::T::kInt || cnt->t == Value::T::kBool)) {
      int64_t times = cnt->t == Value::T::kBool ? cnt->b : cnt->i;
      size_t unit = seq->is_str() ? seq->s.size() : seq->list->size();
      uint64_t limit = seq->is_str() ? kMaxOutput : kMaxListItems;
      if (times > 0 && unit > 0 && static_cast<uint64_t>(times) > limit / unit) fail(at, "repetition result too large");
      if (seq->is_str()) {
        std::string out;
        for (int64_t k = 0; k < times; ++k) out += seq->s;
        return Value::str(out);
      }
      List items;
      for (int64_t k = 0; k < times; ++k) items.insert(items.end(), seq->list->begin(), seq->list->end());
      return seq->tuple ? Value::make_tuple(std::move(items)) : Value::make_list(std::move(items));
    }
  }
  if (!a.is_number() || !b.is_number()) bad_types();
  bool ints = a.t != Value::T::kFloat && b.t != Value::T::kFloat;
  int64_t ai = a.t == Value::T::kBool ? a.b : a.i, bi = b.t == Value::T::kBool ? b.b : b.i;
  double af = a.as_double(), bf = b.as_double();
  int64_t ri = 0;
  // Python integers do not overflow; ours raise instead of wrapping.
  auto checked = [&](bool overflow) {
    if (overflow) fail(at, "integer overflow");
    return Value::integer(ri);
  };
  if (op == "+") return ints ? checked(__builtin_add_overflow(ai, bi, &ri)) : Value::real(af + bf);
  if (op == "-") return ints ? checked(__builtin_sub_overflow(ai, bi, &ri)) : Value::real(af - bf);
  if (op == "*") return ints ? checked(__builtin_mul_overflow(ai, bi, &ri)) : Value::real(af * bf);
  if (op == "/") {
    if (bf == 0) fail(at, "division by zero");
    return Value::real(af / bf);
  }
  if (op == "//" || op == "%") {
    if (ints) {
      if (bi == 0) fail(at, "integer division or modulo by zero");
      if (ai == INT64_MIN && bi == -1) fail(at, "integer overflow");
      int64_t q = ai / bi, r = ai % bi;
      if (r != 0 && ((r < 0) != (bi < 0))) {
        --q;
        r += bi;
      }
      return Value::integer(op == "//" ? q : r);
    }
    if (bf == 0) fail(at, "float division by zero");
    // CPython's float_divmod, for bit-identical results.
    double mod = std::fmod(af, bf), div = (af - mod) / bf;
    if (mod != 0) {
      if ((bf < 0) != (mod < 0)) {
        mod += bf;
        div -= 1.0;
      }
    } else {
      mod = std::copysign(0.0, bf);
    }
    double floordiv;
    if (div != 0) {
      floordiv = std::floor(div);
      if (div - floordiv > 0.5) floordiv += 1.0;
    } else {
      floordiv = std::copysign(0.0, af / bf);
    }
    return Value::real(op == "//" ? floordiv : mod);
  }
  if (op == "**") {
    if (ints && bi >= 0) {
      int64_t r = 1;
      for (int64_t k = 0; k < bi; ++k) {
        if (__builtin_mul_overflow(r, ai, &r)) fail(at, "integer overflow");
        if (r == 0 || r == 1) break;
        if (r == -1) {
          r = (bi % 2 == 0) ? 1 : -1;
          break;
        }
      }
      return Value::integer(r);
    }
    return Value::real(std::pow(af, bf));
  }
  bad_types();
  return {};
}

bool Renderer::compare(const std::string& op, const Value& a, const Value& b, Pos at) {
  if (op == "==") return equal(a, b);
  if (op == "!=") return !equal(a, b);
  if (op == "in" || op == "notin") {
    bool r;
    if (b.is_str()) {
      if (!a.is_str()) fail(at, str("'in <string>' requires string as left operand, not ", type_name(a)));
      r = b.s.find(a.s) != std::string::npos;
    } else if (b.is_list()) {
      r = std::any_of(b.list->begin(), b.list->end(), [&](const Value& x) { return equal(x, a); });
    } else if (b.is_dict()) {
      if (a.is_list() || a.is_dict() || a.t == Value::T::kNamespace) {
        if (!(a.is_list() && a.tuple)) fail(at, str("unhashable type: '", type_name(a), "'"));
      }
      r = a.is_str() && b.dict->find(a.s);
    } else if (b.is_undefined()) {
      r = false;
    } else {
      fail(at, str("argument of type '", type_name(b), "' is not iterable"));
    }
    return op == "in" ? r : !r;
  }
  int c;
  if (a.is_number() && b.is_number()) {
    double x = a.as_double(), y = b.as_double();
    c = x < y ? -1 : x > y ? 1 : 0;
  } else if (a.is_str() && b.is_str()) {
    c = a.s < b.s ? -1 : a.s > b.s ? 1 : 0;
  } else if (a.is_list() && b.is_list() && a.tuple == b.tuple) {
    // Lexicographic, as Python compares sequences.
    size_t k = 0;
    while (k < a.list->size() && k < b.list->size() && equal((*a.list)[k], (*b.list)[k])) ++k;
    if (k < a.list->size() && k < b.list->size()) return compare(op, (*a.list)[k], (*b.list)[k], at);
    c = a.list->size() < b.list->size() ? -1 : a.list->size() > b.list->size() ? 1 : 0;
  } else {
    fail(at, str("'", op, "' not supported between instances of '", type_name(a), "' and '", type_name(b), "'"));
  }
  if (op == "<") return c < 0;
  if (op == "<=") return c <= 0;
  if (op == ">") return c > 0;
  return c >= 0;
}

Value Renderer::filter(const Expr& e) {
  Value v = eval(*e.kids[0]);
  Args a = eval_args(e, 1);
  try {
    return apply_filter(e.name, v, a, *this, e.at);
  } catch (const ValueError& err) {
    std::string msg = err.what();
    if (msg.rfind(origin_, 0) == 0) throw;
    fail(e.at, str("filter '", e.name, "': ", msg));
  }
}

bool Renderer::test(const Expr& e) {
  Value v = eval(*e.kids[0]);
  Args a = eval_args(e, 1);
  return run_test(e.name, v, a, *this, e.at);
}

}  // namespace rpg::jinja
