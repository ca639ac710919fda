#include "rpg/jinja/parser.h"

#include <algorithm>

#include "rpg/core/error.h"
#include "rpg/jinja/builtins.h"

namespace rpg::jinja {

namespace {

class Parser {
 public:
  Parser(std::vector<Token> toks, const std::string& origin) : t_(std::move(toks)), origin_(origin) {}

  Body parse_template() {
    Body body = parse_body({});
    if (cur().type != Tk::kEof) fail(cur(), "unexpected tag");
    return body;
  }

 private:
  [[noreturn]] void fail(const Token& tk, const std::string& why) const {
    throw FormatError(str(origin_, ":", tk.line, ":", tk.col, ": ", why));
  }
  const Token& cur() const { return t_[i_]; }
  const Token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  bool is_op(const char* op) const { return cur().type == Tk::kOp && cur().text == op; }
  bool is_name(const char* n) const { return cur().type == Tk::kName && cur().text == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) fail(cur(), str("expected '", op, "'", describe()));
    ++i_;
  }
  void expect_block_end() {
    if (cur().type != Tk::kBlockEnd) fail(cur(), str("expected end of statement block", describe()));
    ++i_;
  }
  std::string describe() const {
    const Token& c = cur();
    switch (c.type) {
      case Tk::kName:
      case Tk::kOp: return str(", got '", c.text, "'");
      case Tk::kEof: return ", got end of template";
      case Tk::kBlockEnd: return ", got '%}'";
      case Tk::kVarEnd: return ", got '}}'";
      default: return "";
    }
  }
  std::string expect_name() {
    if (cur().type != Tk::kName) fail(cur(), str("expected a name", describe()));
    return t_[i_++].text;
  }

  // Parses nodes until a block tag whose name is in `stops` (left unconsumed, positioned
  // at the tag name) or the end of the template.
  Body parse_body(std::initializer_list<const char*> stops) {
    Body body;
    while (true) {
      const Token& tk = cur();
      if (tk.type == Tk::kEof) {
        if (stops.size()) fail(tk, str("unexpected end of template, expected '", *stops.begin(), "'"));
        return body;
      }
      if (tk.type == Tk::kData) {
        auto n = std::make_unique<Node>();
        n->k = Node::K::kText;
        n->at = {tk.line, tk.col};
        n->text = tk.text;
        body.push_back(std::move(n));
        ++i_;
      } else if (tk.type == Tk::kVarBegin) {
        ++i_;
        auto n = std::make_unique<Node>();
        n->k = Node::K::kOutput;
        n->at = {tk.line, tk.col};
        n->expr = parse_tuple_expr();
        if (cur().type != Tk::kVarEnd) fail(cur(), str("expected '}}'", describe()));
        ++i_;
        body.push_back(std::move(n));
      } else if (tk.type == Tk::kBlockBegin) {
        const Token& name = peek();
        if (name.type != Tk::kName) fail(name, "expected a statement name");
        for (const char* s : stops)
          if (name.text == s) {
            ++i_;  // now at the tag name
            return body;
          }
        ++i_;
        body.push_back(parse_statement());
      } else {
        fail(tk, "unexpected token");
      }
    }
  }

  NodeP parse_statement() {
    const Token& tk = cur();
    Depth guard(*this, tk);
    std::string kw = tk.text;
    auto n = std::make_unique<Node>();
    n->at = {tk.line, tk.col};
    ++i_;
    if (kw == "if") {
      n->k = Node::K::kIf;
      ExprP cond = parse_tuple_expr();
      expect_block_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"});
        n->branches.emplace_back(std::move(cond), std::move(b));
        std::string stop = t_[i_++].text;
        if (stop == "elif") {
          cond = parse_tuple_expr();
          expect_block_end();
        } else if (stop == "else") {
          expect_block_end();
          n->else_body = parse_body({"endif"});
          ++i_;
          expect_block_end();
          break;
        } else {
          expect_block_end();
          break;
        }
      }
    } else if (kw == "for") {
      n->k = Node::K::kFor;
      n->targets.push_back(expect_name());
      while (is_op(",")) {
        ++i_;
        n->targets.push_back(expect_name());
      }
      if (!is_name("in")) fail(cur(), str("expected 'in'", describe()));
      ++i_;
      n->expr = parse_tuple_expr(/*no_cond=*/true);
      if (is_name("if")) {
        ++i_;
        n->cond = parse_tuple_expr();
      }
      if (is_name("recursive")) fail(cur(), "unsupported construct: recursive for loop");
      expect_block_end();
      n->body = parse_body({"else", "endfor"});
      if (t_[i_++].text == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"});
        ++i_;
      }
      expect_block_end();
    } else if (kw == "set") {
      std::string first = expect_name();
      if (is_op(".")) {
        ++i_;
        n->k = Node::K::kSet;
        n->targets.push_back(first);
        n->attr = expect_name();
        expect_op("=");
        n->expr = parse_tuple_expr();
        expect_block_end();
      } else {
        n->targets.push_back(first);
        while (is_op(",")) {
          ++i_;
          n->targets.push_back(expect_name());
        }
        if (cur().type == Tk::kBlockEnd && n->targets.size() == 1) {
          n->k = Node::K::kSetBlock;
          ++i_;
          n->body = parse_body({"endset"});
          ++i_;
          expect_block_end();
        } else {
          n->k = Node::K::kSet;
          expect_op("=");
          n->expr = parse_tuple_expr();
          expect_block_end();
        }
      }
    } else if (kw == "macro") {
      n->k = Node::K::kMacro;
      n->targets.push_back(expect_name());
      expect_op("(");
      while (!is_op(")")) {
        std::string p = expect_name();
        ExprP dflt;
        if (is_op("=")) {
          ++i_;
          dflt = parse_expr();
        }
        n->params.emplace_back(p, std::move(dflt));
        if (!is_op(",")) break;
        ++i_;
      }
      expect_op(")");
      expect_block_end();
      n->body = parse_body({"endmacro"});
      ++i_;
      expect_block_end();
    } else if (kw == "break" || kw == "continue") {
      n->k = kw == "break" ? Node::K::kBreak : Node::K::kContinue;
      expect_block_end();
    } else if (kw == "generation") {
      n->k = Node::K::kGeneration;
      expect_block_end();
      n->body = parse_body({"endgeneration"});
      ++i_;
      expect_block_end();
    } else if (kw == "do") {
      n->k = Node::K::kCallExpr;
      n->expr = parse_tuple_expr();
      expect_block_end();
    } else {
      fail(tk, str("unsupported construct: '", kw, "' tag"));
    }
    return n;
  }

  ExprP make(Expr::K k, const Token& at) {
    auto e = std::make_unique<Expr>();
    e->k = k;
    e->at = {at.line, at.col};
    return e;
  }

  // An expression, or a bare tuple "a, b" as jinja allows in {{ }} and set.
  ExprP parse_tuple_expr(bool no_cond = false) {
    const Token& at = cur();
    ExprP first = no_cond ? parse_or() : parse_expr();
    if (!is_op(",")) return first;
    auto tup = make(Expr::K::kTuple, at);
    tup->kids.push_back(std::move(first));
    while (is_op(",")) {
      ++i_;
      if (cur().type == Tk::kBlockEnd || cur().type == Tk::kVarEnd) break;
      tup->kids.push_back(no_cond ? parse_or() : parse_expr());
    }
    return tup;
  }

  ExprP parse_expr() {
    const Token& at = cur();
    ExprP e = parse_or();
    while (is_name("if")) {
      ++i_;
      auto c = make(Expr::K::kCond, at);
      ExprP cond = parse_or();
      ExprP other;
      if (is_name("else")) {
        ++i_;
        other = parse_expr();
      }
      c->kids.push_back(std::move(cond));
      c->kids.push_back(std::move(e));
      c->kids.push_back(std::move(other));
      e = std::move(c);
    }
    return e;
  }
  // `a or b or c` / `a and b and c`, folded to the left; the two levels differ only in the
  // keyword and the operand parser.
  template <class Operand>
  ExprP parse_keyword_chain(const char* keyword, Expr::K kind, Operand operand) {
    ExprP e = operand();
    while (is_name(keyword)) {
      const Token& at = cur();
      ++i_;
      auto n = make(kind, at);
      n->kids.push_back(std::move(e));
      n->kids.push_back(operand());
      e = std::move(n);
    }
    return e;
  }
  ExprP parse_or() { return parse_keyword_chain("or", Expr::K::kOr, [this] { return parse_and(); }); }
  ExprP parse_and() { return parse_keyword_chain("and", Expr::K::kAnd, [this] { return parse_not(); }); }
  ExprP parse_not() {
    if (is_name("not")) {
      const Token& at = cur();
      ++i_;
      auto n = make(Expr::K::kNot, at);
      n->kids.push_back(parse_not());
      return n;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    const Token& at = cur();
    ExprP e = parse_math1();
    ExprP cmp;
    while (true) {
      std::string op;
      if (cur().type == Tk::kOp &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" ||
           cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        ++i_;
      } else if (is_name("in")) {
        op = "in";
        ++i_;
      } else if (is_name("not") && peek().type == Tk::kName && peek().text == "in") {
        op = "notin";
        i_ += 2;
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::K::kCompare, at);
        cmp->kids.push_back(std::move(e));
      }
      cmp->ops.push_back(op);
      cmp->kids.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }
  ExprP bin(const Token& at, const std::string& op, ExprP a, ExprP b) {
    auto n = make(Expr::K::kBin, at);
    n->name = op;
    n->kids.push_back(std::move(a));
    n->kids.push_back(std::move(b));
    return n;
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& at = cur();
      std::string op = t_[i_++].text;
      e = bin(at, op, std::move(e), parse_concat());
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (is_op("~")) {
      const Token& at = cur();
      ++i_;
      e = bin(at, "~", std::move(e), parse_math2());
    }
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& at = cur();
      std::string op = t_[i_++].text;
      e = bin(at, op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary(true);
    while (is_op("**")) {
      const Token& at = cur();
      ++i_;
      e = bin(at, "**", std::move(e), parse_unary(true));
    }
    return e;
  }
  ExprP parse_unary(bool with_filter) {
    const Token& at = cur();
    Depth guard(*this, at);
    ExprP e;
    if (is_op("-") || is_op("+")) {
      bool neg = is_op("-");
      ++i_;
      e = make(neg ? Expr::K::kNeg : Expr::K::kPos, at);
      e->kids.push_back(parse_unary(false));
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprP parse_primary() {
    const Token& tk = cur();
    switch (tk.type) {
      case Tk::kName: {
        ++i_;
        if (tk.text == "true" || tk.text == "True" || tk.text == "false" || tk.text == "False") {
          auto e = make(Expr::K::kLiteral, tk);
          e->literal = Value::boolean(tk.text[0] == 't' || tk.text[0] == 'T');
          return e;
        }
        if (tk.text == "none" || tk.text == "None") {
          auto e = make(Expr::K::kLiteral, tk);
          e->literal = Value::none();
          return e;
        }
        auto e = make(Expr::K::kName, tk);
        e->name = tk.text;
        return e;
      }
      case Tk::kString: {
        ++i_;
        std::string s = tk.text;
        while (cur().type == Tk::kString) s += t_[i_++].text;  // adjacent literals concatenate
        auto e = make(Expr::K::kLiteral, tk);
        e->literal = Value::str(std::move(s));
        return e;
      }
      case Tk::kInt: {
        ++i_;
        auto e = make(Expr::K::kLiteral, tk);
        try {
          e->literal = Value::integer(std::stoll(tk.text));
        } catch (const std::exception&) {
          fail(tk, "integer literal out of range");
        }
        return e;
      }
      case Tk::kFloat: {
        ++i_;
        auto e = make(Expr::K::kLiteral, tk);
        e->literal = Value::real(std::strtod(tk.text.c_str(), nullptr));
        return e;
      }
      case Tk::kOp:
        if (tk.text == "(") {
          ++i_;
          if (is_op(")")) {
            ++i_;
            return make(Expr::K::kTuple, tk);
          }
          ExprP e = parse_expr();
          if (is_op(",")) {
            auto tup = make(Expr::K::kTuple, tk);
            tup->kids.push_back(std::move(e));
            while (is_op(",")) {
              ++i_;
              if (is_op(")")) break;
              tup->kids.push_back(parse_expr());
            }
            e = std::move(tup);
          }
          expect_op(")");
          return e;
        }
        if (tk.text == "[") {
          ++i_;
          auto e = make(Expr::K::kList, tk);
          while (!is_op("]")) {
            e->kids.push_back(parse_expr());
            if (!is_op(",")) break;
            ++i_;
          }
          expect_op("]");
          return e;
        }
        if (tk.text == "{") {
          ++i_;
          auto e = make(Expr::K::kDict, tk);
          while (!is_op("}")) {
            e->kids.push_back(parse_expr());
            expect_op(":");
            e->kids.push_back(parse_expr());
            if (!is_op(",")) break;
            ++i_;
          }
          expect_op("}");
          return e;
        }
        break;
      default: break;
    }
    fail(tk, str("unexpected token in expression", describe()));
  }

  void parse_call_args(Expr& call) {
    expect_op("(");
    std::vector<ExprP> pos, kw;
    while (!is_op(")")) {
      if (is_op("*") || is_op("**")) fail(cur(), "unsupported construct: *args / **kwargs in a call");
      if (cur().type == Tk::kName && peek().type == Tk::kOp && peek().text == "=") {
        std::string name = t_[i_].text;
        i_ += 2;
        call.kw_names.push_back(name);
        kw.push_back(parse_expr());
      } else {
        if (!kw.empty()) fail(cur(), "positional argument after keyword argument");
        pos.push_back(parse_expr());
      }
      if (!is_op(",")) break;
      ++i_;
    }
    expect_op(")");
    for (auto& p : pos) call.kids.push_back(std::move(p));
    for (auto& k : kw) call.kids.push_back(std::move(k));
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      const Token& at = cur();
      if (is_op(".")) {
        ++i_;
        auto n = make(Expr::K::kAttr, at);
        if (cur().type == Tk::kInt) {
          n->k = Expr::K::kItem;
          auto idx = make(Expr::K::kLiteral, cur());
          const Token& num = t_[i_++];
          try {
            idx->literal = Value::integer(std::stoll(num.text));
          } catch (const std::exception&) {  // as an integer literal (fuzz_chat_template finding)
            fail(num, "integer literal out of range");
          }
          n->kids.push_back(std::move(e));
          n->kids.push_back(std::move(idx));
        } else {
          n->name = expect_name();
          n->kids.push_back(std::move(e));
        }
        e = std::move(n);
      } else if (is_op("[")) {
        ++i_;
        // Subscript or slice a[b], a[b:c], a[b:c:d], any part optional.
        ExprP parts[3];
        int colons = 0;
        if (!is_op(":") && !is_op("]")) {
          parts[0] = parse_expr();
          if (is_op(",")) {
            auto tup = make(Expr::K::kTuple, at);
            tup->kids.push_back(std::move(parts[0]));
            while (is_op(",")) {
              ++i_;
              if (is_op("]")) break;
              tup->kids.push_back(parse_expr());
            }
            parts[0] = std::move(tup);
          }
        }
        while (is_op(":") && colons < 2) {
          ++i_;
          ++colons;
          if (!is_op(":") && !is_op("]")) parts[colons] = parse_expr();
        }
        expect_op("]");
        auto n = make(colons ? Expr::K::kSlice : Expr::K::kItem, at);
        if (!colons && !parts[0]) parts[0] = make(Expr::K::kTuple, at);
        n->kids.push_back(std::move(e));
        for (auto& p : parts) n->kids.push_back(std::move(p));
        if (!colons) n->kids.resize(2);
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = make(Expr::K::kCall, at);
        n->kids.push_back(std::move(e));
        parse_call_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  ExprP parse_filter_expr(ExprP e) {
    while (true) {
      const Token& at = cur();
      if (is_op("|")) {
        ++i_;
        const Token& nt = cur();
        std::string name = expect_name();
        while (is_op(".")) {
          ++i_;
          name += "." + expect_name();
        }
        if (!find_filter(name)) fail(nt, str("unsupported construct: filter '", name, "'"));
        auto n = make(Expr::K::kFilter, at);
        n->name = name;
        n->kids.push_back(std::move(e));
        if (is_op("(")) parse_call_args(*n);
        e = std::move(n);
      } else if (is_name("is")) {
        ++i_;
        auto n = make(Expr::K::kTest, at);
        if (is_name("not")) {
          ++i_;
          n->negated = true;
        }
        const Token& nt = cur();
        std::string name;
        if (cur().type == Tk::kName) {
          name = t_[i_++].text;
        } else if (cur().type == Tk::kOp && find_test(cur().text)) {
          name = t_[i_++].text;
        } else {
          fail(cur(), str("expected a test name", describe()));
        }
        if (!find_test(name)) fail(nt, str("unsupported construct: test '", name, "'"));
        n->name = name;
        n->kids.push_back(std::move(e));
        if (is_op("(")) {
          parse_call_args(*n);
        } else if (cur().type == Tk::kString || cur().type == Tk::kInt || cur().type == Tk::kFloat ||
                   (cur().type == Tk::kName && cur().text != "and" && cur().text != "or" &&
                    cur().text != "else" && cur().text != "if" && cur().text != "is" && cur().text != "in" &&
                    cur().text != "not")) {
          // A single argument without parentheses: `x is divisibleby 3`, `x is sameas none`.
          n->kids.push_back(parse_primary());
        }
        e = std::move(n);
      } else if (is_op("(")) {
        auto n = make(Expr::K::kCall, at);
        n->kids.push_back(std::move(e));
        parse_call_args(*n);
        e = std::move(n);
      } else {
        return e;
      }
    }
  }

  // Recursion depth of the descent, bounded so hostile input cannot exhaust the stack.
  struct Depth {
    Parser& p;
    Depth(Parser& parser, const Token& at) : p(parser) {
      if (++p.depth_ > kMaxDepth) p.fail(at, "template nesting too deep");
    }
    ~Depth() { --p.depth_; }
  };
  static constexpr int kMaxDepth = 200;
  int depth_ = 0;
  std::vector<Token> t_;
  size_t i_ = 0;
  const std::string& origin_;
};

}  // namespace

Body parse(std::vector<Token> toks, const std::string& origin) { return Parser(std::move(toks), origin).parse_template(); }

}  // namespace rpg::jinja
