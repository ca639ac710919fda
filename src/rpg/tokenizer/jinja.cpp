#include "rpg/tokenizer/jinja.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <map>
#include <set>

#include "rpg/core/error.h"
#include "rpg/core/text.h"
#include "rpg/tokenizer/jinja_value.h"
#include "rpg/tokenizer/unicode.h"

namespace rpg::jinja {

namespace {

// ---------------------------------------------------------------------------------------
// Lexer. Follows jinja2's lexer with the options transformers uses: trim_blocks (drop the
// first newline after a block or comment tag), lstrip_blocks (drop spaces and tabs before
// a block or comment tag that starts a line), '-' / '+' whitespace control, newlines
// normalised to \n and one trailing newline of the source dropped.

enum class Tk { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tk type;
  std::string text;  // data, name, decoded string, operator, number spelling
  int line, col;
};

struct Pos {
  int line, col;
};

// Python's str.isspace(): the White_Space property plus the ASCII separators 0x1c-0x1f.
bool py_space(char32_t c) { return (c >= 0x1c && c <= 0x1f) || tok::is_space(c); }

class Lexer {
 public:
  Lexer(std::string_view src, const std::string& origin) : origin_(origin) {
    // Newlines normalised and one trailing newline dropped, as jinja2 does.
    src_.reserve(src.size());
    for (size_t i = 0; i < src.size(); ++i) {
      if (src[i] == '\r') {
        src_ += '\n';
        if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
      } else {
        src_ += src[i];
      }
    }
    if (!src_.empty() && src_.back() == '\n') src_.pop_back();
  }

  std::vector<Token> run() {
    bool line_starting = true;
    size_t pos = 0;
    while (pos < src_.size()) {
      size_t start = find_tag(pos);
      if (start == std::string::npos) {
        emit_data(pos, src_.size());
        break;
      }
      char kind = src_[start + 1];  // '{', '%' or '#'
      char ctl = start + 2 < src_.size() ? src_[start + 2] : '\0';
      size_t data_end = start;
      if (ctl == '-') {
        data_end = rstrip_pos(pos, start);
      } else if (ctl != '+' && kind != '{') {
        // lstrip_blocks: whitespace between the line start and the tag goes.
        std::string_view text(src_.data() + pos, start - pos);
        size_t nl = text.rfind('\n');
        size_t l_pos = nl == std::string_view::npos ? 0 : nl + 1;
        if ((l_pos > 0 || line_starting) && only_py_space(pos + l_pos, start)) data_end = pos + l_pos;
      }
      emit_data(pos, data_end);
      size_t body = start + 2 + ((ctl == '-' || ctl == '+') ? 1 : 0);
      Pos at = pos_of(start);
      if (kind == '#') {
        size_t end = src_.find("#}", body);
        if (end == std::string::npos) fail(at, "missing end of comment tag");
        pos = after_end(end, 2, true, line_starting);
        continue;
      }
      if (kind == '%' && is_raw(body)) {
        pos = lex_raw(start, body, line_starting);
        continue;
      }
      toks_.push_back({kind == '{' ? Tk::kVarBegin : Tk::kBlockBegin, "", at.line, at.col});
      pos = lex_tag(body, kind == '{', line_starting);
    }
    Pos end = pos_of(src_.size());
    toks_.push_back({Tk::kEof, "", end.line, end.col});
    return std::move(toks_);
  }

  [[noreturn]] void fail(Pos p, const std::string& why) const {
    throw FormatError(str(origin_, ":", p.line, ":", p.col, ": ", why));
  }

 private:
  Pos pos_of(size_t off) const {
    // Tags are few, so a linear count is fine.
    int line = 1, col = 1;
    for (size_t i = 0; i < off && i < src_.size(); ++i) {
      if (src_[i] == '\n') {
        ++line;
        col = 1;
      } else if ((static_cast<unsigned char>(src_[i]) & 0xC0) != 0x80) {
        ++col;
      }
    }
    return {line, col};
  }

  size_t find_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#')) return i;
    return std::string::npos;
  }

  // Python's str.rstrip(): returns the end of src_[from, end) without trailing whitespace.
  size_t rstrip_pos(size_t from, size_t end) const {
    while (end > from) {
      size_t k = end - 1;
      while (k > from && (static_cast<unsigned char>(src_[k]) & 0xC0) == 0x80) --k;
      char32_t c;
      size_t bad;
      if (tok::decode_utf8(src_, k, c, bad) == 0 || !py_space(c)) break;
      end = k;
    }
    return end;
  }
  size_t lstrip_pos(size_t from) const {
    while (from < src_.size()) {
      char32_t c;
      size_t bad;
      size_t len = tok::decode_utf8(src_, from, c, bad);
      if (len == 0 || !py_space(c)) break;
      from += len;
    }
    return from;
  }
  bool only_py_space(size_t from, size_t end) const {
    if (from >= end) return false;  // jinja's \s+ needs one character; nothing to strip anyway
    return lstrip_pos(from) >= end;
  }

  void emit_data(size_t from, size_t to) {
    if (to > from) {
      Pos p = pos_of(from);
      toks_.push_back({Tk::kData, src_.substr(from, to - from), p.line, p.col});
    }
  }

  // After a closing delimiter at `end` of length `len`: '-' before it strips all following
  // whitespace, '+' keeps everything, otherwise trim_blocks drops one newline (block and
  // comment tags only).
  size_t after_end(size_t end, size_t len, bool trim, bool& line_starting) {
    size_t next = end + len;
    char before = end > 0 ? src_[end - 1] : '\0';
    size_t to = next;
    if (before == '-') to = lstrip_pos(next);
    else if (before != '+' && trim && next < src_.size() && src_[next] == '\n') to = next + 1;
    // jinja2 treats the next text as starting a line when this tag's match ended in \n.
    line_starting = to > next && src_[to - 1] == '\n';
    return to;
  }

  bool is_raw(size_t body) const {
    size_t p = body;
    while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t' || src_[p] == '\n')) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t' || src_[p] == '\n')) ++p;
    return src_.compare(p, 2, "%}") == 0 || src_.compare(p, 3, "-%}") == 0;
  }

  size_t lex_raw(size_t start, size_t body, bool& line_starting) {
    size_t p = src_.find("%}", body);
    size_t content = p + 2;
    if (src_[p - 1] == '-') content = lstrip_pos(content);
    // Find {%[-+]? endraw [-+]?%}
    for (size_t q = src_.find("{%", content); q != std::string::npos; q = src_.find("{%", q + 2)) {
      size_t r = q + 2;
      char ctl = r < src_.size() ? src_[r] : '\0';
      if (ctl == '-' || ctl == '+') ++r;
      while (r < src_.size() && (src_[r] == ' ' || src_[r] == '\t' || src_[r] == '\n')) ++r;
      if (src_.compare(r, 6, "endraw") != 0) continue;
      r += 6;
      while (r < src_.size() && (src_[r] == ' ' || src_[r] == '\t' || src_[r] == '\n')) ++r;
      size_t close;
      if (src_.compare(r, 2, "%}") == 0) close = r;
      else if ((src_[r] == '-' || src_[r] == '+') && src_.compare(r + 1, 2, "%}") == 0) close = r + 1;
      else continue;
      size_t data_end = q;
      if (ctl == '-') data_end = rstrip_pos(content, q);
      emit_data(content, data_end);
      return after_end(close, 2, true, line_starting);
    }
    fail(pos_of(start), "missing end of raw directive");
  }

  size_t lex_tag(size_t p, bool variable, bool& line_starting) {
    std::vector<char> balance;
    while (true) {
      while (p < src_.size() && (src_[p] == ' ' || src_[p] == '\t' || src_[p] == '\n' || src_[p] == '\r' ||
                                 src_[p] == '\f' || src_[p] == '\v'))
        ++p;
      if (p >= src_.size()) fail(pos_of(p), variable ? "unexpected end of template, expected '}}'" : "unexpected end of template, expected '%}'");
      Pos at = pos_of(p);
      if (balance.empty()) {
        const char* close = variable ? "}}" : "%}";
        if (src_.compare(p, 2, close) == 0) {
          toks_.push_back({variable ? Tk::kVarEnd : Tk::kBlockEnd, "", at.line, at.col});
          return after_end(p, 2, !variable, line_starting);
        }
        if ((src_[p] == '-' || (!variable && src_[p] == '+')) && src_.compare(p + 1, 2, close) == 0) {
          toks_.push_back({variable ? Tk::kVarEnd : Tk::kBlockEnd, "", at.line, at.col});
          return after_end(p + 1, 2, !variable, line_starting);
        }
      }
      char c = src_[p];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t q = p;
        while (q < src_.size() && (std::isalnum(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
        toks_.push_back({Tk::kName, src_.substr(p, q - p), at.line, at.col});
        p = q;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t q = p;
        while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
        bool is_float = false;
        if (q + 1 < src_.size() && src_[q] == '.' && std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
          is_float = true;
          ++q;
          while (q < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_')) ++q;
        }
        if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
          size_t r = q + 1;
          if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
          if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
            is_float = true;
            q = r;
            while (q < src_.size() && std::isdigit(static_cast<unsigned char>(src_[q]))) ++q;
          }
        }
        std::string num = src_.substr(p, q - p);
        num.erase(std::remove(num.begin(), num.end(), '_'), num.end());
        toks_.push_back({is_float ? Tk::kFloat : Tk::kInt, num, at.line, at.col});
        p = q;
      } else if (c == '\'' || c == '"') {
        p = lex_string(p, at);
      } else {
        static const char* two[] = {"//", "**", "==", "!=", ">=", "<="};
        std::string op;
        for (const char* t : two)
          if (src_.compare(p, 2, t) == 0) op = t;
        if (op.empty()) {
          if (std::string_view("+-/*%~[](){}<>=.:|,;").find(c) == std::string_view::npos)
            fail(at, str("unexpected character '", std::string(1, c), "'"));
          op = std::string(1, c);
          if (c == '(' || c == '[' || c == '{') balance.push_back(c == '(' ? ')' : c == '[' ? ']' : '}');
          if (c == ')' || c == ']' || c == '}') {
            if (balance.empty() || balance.back() != c) fail(at, str("unexpected '", op, "'"));
            balance.pop_back();
          }
        }
        toks_.push_back({Tk::kOp, op, at.line, at.col});
        p += op.size();
      }
    }
  }

  // A string literal, with Python's unicode-escape decoding as jinja2 applies it.
  size_t lex_string(size_t p, Pos at) {
    char q = src_[p];
    std::string out;
    size_t i = p + 1;
    while (true) {
      if (i >= src_.size()) fail(at, "unterminated string literal");
      char c = src_[i];
      if (c == q) break;
      if (c != '\\') {
        out += c;
        ++i;
        continue;
      }
      if (i + 1 >= src_.size()) fail(at, "unterminated string literal");
      char e = src_[i + 1];
      i += 2;
      auto hex = [&](int n) -> char32_t {
        if (i + static_cast<size_t>(n) > src_.size()) fail(at, "truncated escape in string literal");
        char32_t v = 0;
        for (int k = 0; k < n; ++k) {
          char h = src_[i + static_cast<size_t>(k)];
          int d = std::isdigit(static_cast<unsigned char>(h)) ? h - '0'
                  : (h >= 'a' && h <= 'f') ? h - 'a' + 10
                  : (h >= 'A' && h <= 'F') ? h - 'A' + 10 : -1;
          if (d < 0) fail(at, "truncated escape in string literal");
          v = v * 16 + static_cast<char32_t>(d);
        }
        i += static_cast<size_t>(n);
        return v;
      };
      switch (e) {
        case '\n': break;
        case '\\': out += '\\'; break;
        case '\'': out += '\''; break;
        case '"': out += '"'; break;
        case 'a': out += '\a'; break;
        case 'b': out += '\b'; break;
        case 'f': out += '\f'; break;
        case 'n': out += '\n'; break;
        case 'r': out += '\r'; break;
        case 't': out += '\t'; break;
        case 'v': out += '\v'; break;
        case 'x': tok::append_utf8(out, hex(2)); break;
        case 'u': tok::append_utf8(out, hex(4)); break;
        case 'U': {
          char32_t v = hex(8);
          if (v > 0x10FFFF) fail(at, "illegal Unicode character in string literal");
          tok::append_utf8(out, v);
          break;
        }
        case 'N': fail(at, "unsupported construct: \\N{...} escape");
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k, ++i)
              v = v * 8 + static_cast<char32_t>(src_[i] - '0');
            tok::append_utf8(out, v);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    std::string valid;
    if (tok::sanitize_utf8(out, valid)) valid = std::move(out);
    toks_.push_back({Tk::kString, std::move(valid), at.line, at.col});
    return i + 1;
  }

  std::string src_;
  const std::string& origin_;
  std::vector<Token> toks_;
};

// ---------------------------------------------------------------------------------------
// AST.

struct Expr;
using ExprP = std::unique_ptr<Expr>;

struct Expr {
  enum class K {
    kLiteral, kName, kAttr, kItem, kSlice, kCall, kFilter, kTest, kNot, kNeg, kPos, kBin, kAnd, kOr,
    kCompare, kCond, kList, kTuple, kDict
  };
  K k;
  Pos at;
  Value literal;
  std::string name;  // variable / attribute / filter / test / operator
  std::vector<ExprP> kids;
  std::vector<std::string> kw_names;  // call/filter/test: names of the trailing kids that are keyword args
  std::vector<std::string> ops;       // compare: the operators between kids
  bool negated = false;
};

struct Node;
using NodeP = std::unique_ptr<Node>;
using Body = std::vector<NodeP>;

struct Node {
  enum class K { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue, kGeneration, kCallExpr };
  K k;
  Pos at;
  std::string text;                  // text node
  ExprP expr;                        // output / set value / for iterable
  ExprP cond;                        // for filter
  std::vector<std::pair<ExprP, Body>> branches;  // if / elif conditions with bodies
  Body body, else_body;
  std::vector<std::string> targets;  // set / for targets; "ns.attr" for namespace assignment
  std::string attr;                  // set ns.attr
  std::vector<std::pair<std::string, ExprP>> params;  // macro parameters with defaults
  std::set<std::string> stored;      // for / macro: names its body assigns directly
};

const std::set<std::string, std::less<>> kFilters = {
    "abs", "attr", "capitalize", "count", "d", "default", "dictsort", "e", "escape", "first", "float",
    "indent", "int", "items", "join", "last", "length", "list", "lower", "map", "max", "min", "reject",
    "rejectattr", "replace", "reverse", "round", "safe", "select", "selectattr", "sort", "string", "sum",
    "title", "tojson", "trim", "unique", "upper", "wordcount"};
const std::set<std::string, std::less<>> kTests = {
    "boolean", "callable", "defined", "divisibleby", "eq", "equalto", "escaped", "even", "false", "filter",
    "float", "ge", "gt", "in", "integer", "iterable", "le", "lower", "lt", "mapping", "ne", "none", "number",
    "odd", "sameas", "sequence", "string", "test", "true", "undefined", "upper", "==", "!=", "<", "<=", ">", ">="};

// ---------------------------------------------------------------------------------------
// Parser: recursive descent with jinja2's operator precedence.

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
  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      const Token& at = cur();
      ++i_;
      auto n = make(Expr::K::kOr, at);
      n->kids.push_back(std::move(e));
      n->kids.push_back(parse_and());
      e = std::move(n);
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      const Token& at = cur();
      ++i_;
      auto n = make(Expr::K::kAnd, at);
      n->kids.push_back(std::move(e));
      n->kids.push_back(parse_not());
      e = std::move(n);
    }
    return e;
  }
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
          idx->literal = Value::integer(std::stoll(t_[i_++].text));
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
        if (!kFilters.count(name)) fail(nt, str("unsupported construct: filter '", name, "'"));
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
        } else if (cur().type == Tk::kOp && kTests.count(cur().text)) {
          name = t_[i_++].text;
        } else {
          fail(cur(), str("expected a test name", describe()));
        }
        if (name == "none" || name == "true" || name == "false") name = name;  // lower-case tests
        if (!kTests.count(name)) fail(nt, str("unsupported construct: test '", name, "'"));
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


// ---------------------------------------------------------------------------------------
// Evaluation.

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
  Renderer(const std::string& origin) : origin_(origin) {}

  [[noreturn]] void fail(Pos at, const std::string& why) const {
    throw ValueError(str(origin_, ":", at.line, ":", at.col, ": ", why));
  }

  // Scopes: the template's top level, then one frame per for loop or macro call. `set`
  // writes to the innermost frame, so assignments inside a loop do not leak out of it,
  // as in jinja2 (the reason templates use namespace()).
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

  Value lookup(const std::string& name) const {
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
  void push_frame(std::shared_ptr<Dict> f, const std::set<std::string>* stored) {
    frames.push_back(std::move(f));
    frame_stored.resize(frames.size(), nullptr);
    frame_stored.back() = stored;
  }
  void set_var(const std::string& name, Value v) {
    if (frames.size() == 2) root_assigned.insert(name);
    frames.back()->set(name, std::move(v));
  }

  void render(const Body& body, std::string& out) {
    for (const NodeP& n : body) {
      if (++steps_ > kMaxSteps) fail(n->at, "template exceeded the render step limit");
      exec(*n, out);
      if (out.size() > kMaxOutput) fail(n->at, "template output exceeded the size limit");
    }
  }
  uint64_t steps_ = 0;
  int call_depth_ = 0;

  void exec(const Node& n, std::string& out) {
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

  void assign(const std::vector<std::string>& targets, Value v, Pos at) {
    if (targets.size() == 1) {
      set_var(targets[0], std::move(v));
      return;
    }
    List items = iterate(v, at);
    if (items.size() != targets.size())
      fail(at, str("cannot unpack ", items.size(), " values into ", targets.size(), " names"));
    for (size_t k = 0; k < targets.size(); ++k) set_var(targets[k], items[k]);
  }

  List iterate(const Value& v, Pos at) {
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
        size_t i = 0;
        while (i < v.s.size()) {
          char32_t c;
          size_t bad;
          size_t len = tok::decode_utf8(v.s, i, c, bad);
          if (len == 0) len = bad;
          chars.push_back(Value::str(v.s.substr(i, len)));
          i += len;
        }
        return chars;
      }
      default: fail(at, str("'", type_name(v), "' object is not iterable"));
    }
  }

  void exec_for(const Node& n, std::string& out) {
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

  Value make_macro(const Node& n) {
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

  // ---- expressions ----

  Value eval(const Expr& e) {
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

  Args eval_args(const Expr& e, size_t first) {
    Args a;
    size_t n_kw = e.kw_names.size();
    size_t n_pos = e.kids.size() - first - n_kw;
    for (size_t k = 0; k < n_pos; ++k) a.pos.push_back(eval(*e.kids[first + k]));
    for (size_t k = 0; k < n_kw; ++k) a.kw.emplace_back(e.kw_names[k], eval(*e.kids[first + n_pos + k]));
    return a;
  }

  Value call(const Value& fn, Args& args, Pos at) {
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

  static size_t cp_count(const std::string& s) {
    size_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }
  // Byte offsets of each code point plus the end, for Python-style indexing of strings.
  static std::vector<size_t> cp_offsets(const std::string& s) {
    std::vector<size_t> off;
    for (size_t i = 0; i < s.size(); ++i)
      if ((static_cast<unsigned char>(s[i]) & 0xC0) != 0x80) off.push_back(i);
    off.push_back(s.size());
    return off;
  }

  Value get_item(const Value& obj, const Value& key, Pos at) {
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

  Value get_attr(const Value& obj, const std::string& name, Pos at);
  Value slice(const Expr& e);
  Value binary(const std::string& op, const Value& a, const Value& b, Pos at);
  bool compare(const std::string& op, const Value& a, const Value& b, Pos at);
  Value filter(const Expr& e);
  bool test(const Expr& e);

  const std::string& origin_;
};

// Python's str.strip family. `chars` null = whitespace.
std::string py_strip(const std::string& s, const Value* chars, bool left, bool right) {
  std::vector<char32_t> set;
  bool ws = !chars || chars->is_none() || chars->is_undefined();
  if (!ws) {
    size_t i = 0;
    const std::string& c = chars->s;
    while (i < c.size()) {
      char32_t cp;
      size_t bad;
      size_t len = tok::decode_utf8(c, i, cp, bad);
      if (len == 0) len = bad, cp = tok::kReplacement;
      set.push_back(cp);
      i += len;
    }
  }
  auto strip_me = [&](char32_t c) { return ws ? py_space(c) : std::find(set.begin(), set.end(), c) != set.end(); };
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      char32_t c;
      size_t bad;
      size_t len = tok::decode_utf8(s, b, c, bad);
      if (len == 0 || !strip_me(c)) break;
      b += len;
    }
  }
  if (right) {
    while (e > b) {
      size_t k = e - 1;
      while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
      char32_t c;
      size_t bad;
      if (tok::decode_utf8(s, k, c, bad) == 0 || !strip_me(c)) break;
      e = k;
    }
  }
  return s.substr(b, e - b);
}

List py_split(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (!sep || sep->is_none()) {
    // Runs of whitespace separate; leading / trailing whitespace yields no empty parts.
    size_t i = 0;
    auto next_cp = [&](size_t at, char32_t& c) {
      size_t bad;
      size_t len = tok::decode_utf8(s, at, c, bad);
      if (len == 0) {
        c = tok::kReplacement;
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

std::string py_case(const std::string& s, int mode) {  // 0 lower, 1 upper
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    char32_t c;
    size_t bad;
    size_t len = tok::decode_utf8(s, i, c, bad);
    if (len == 0) {
      out.append(s, i, bad);
      i += bad;
      continue;
    }
    tok::append_utf8(out, mode ? tok::to_upper(c) : tok::to_lower(c));
    i += len;
  }
  return out;
}

std::string py_capitalize(const std::string& s) {
  if (s.empty()) return s;
  char32_t c;
  size_t bad;
  size_t len = tok::decode_utf8(s, 0, c, bad);
  if (len == 0) return s;
  std::string out;
  tok::append_utf8(out, tok::to_upper(c));
  return out + py_case(s.substr(len), 0);
}

std::string py_title(const std::string& s) {
  std::string out;
  bool prev_cased = false;
  size_t i = 0;
  while (i < s.size()) {
    char32_t c;
    size_t bad;
    size_t len = tok::decode_utf8(s, i, c, bad);
    if (len == 0) {
      out.append(s, i, bad);
      i += bad;
      prev_cased = false;
      continue;
    }
    bool cased = tok::to_upper(c) != c || tok::to_lower(c) != c;
    tok::append_utf8(out, cased ? (prev_cased ? tok::to_lower(c) : tok::to_upper(c)) : c);
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
    auto off = Renderer::cp_offsets(s);
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

Value string_method(const Value& self, const std::string& name, Args& a) {
  const std::string& s = self.s;
  if (name == "strip") return Value::str(py_strip(s, a.get(0, "chars"), true, true));
  if (name == "lstrip") return Value::str(py_strip(s, a.get(0, "chars"), true, false));
  if (name == "rstrip") return Value::str(py_strip(s, a.get(0, "chars"), false, true));
  if (name == "split") return Value::make_list(py_split(s, a.get(0, "sep"), int_arg(a.get(1, "maxsplit"), -1, "split")));
  if (name == "startswith" || name == "endswith") {
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
  if (name == "upper") return Value::str(py_case(s, 1));
  if (name == "lower") return Value::str(py_case(s, 0));
  if (name == "title") return Value::str(py_title(s));
  if (name == "capitalize") return Value::str(py_capitalize(s));
  if (name == "replace")
    return Value::str(py_replace(s, need_str(a.get(0, "old"), "replace").s, need_str(a.get(1, "new"), "replace").s,
                                 int_arg(a.get(2, "count"), -1, "replace")));
  if (name == "find" || name == "count" || name == "index" || name == "rfind") {
    const std::string& sub = need_str(a.get(0, "sub"), name.c_str()).s;
    if (name == "count") {
      if (sub.empty()) return Value::integer(static_cast<int64_t>(Renderer::cp_count(s)) + 1);
      int64_t n = 0;
      for (size_t i = s.find(sub); i != std::string::npos; i = s.find(sub, i + sub.size())) ++n;
      return Value::integer(n);
    }
    size_t j = name == "rfind" ? s.rfind(sub) : s.find(sub);
    if (j == std::string::npos) {
      if (name == "index") throw ValueError("substring not found");
      return Value::integer(-1);
    }
    return Value::integer(static_cast<int64_t>(Renderer::cp_count(s.substr(0, j))));
  }
  if (name == "join") {
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
  if (name == "isdigit" || name == "isalpha" || name == "isalnum" || name == "isspace" || name == "islower" ||
      name == "isupper") {
    if (s.empty()) return Value::boolean(false);
    size_t i = 0;
    bool any_cased = false;
    while (i < s.size()) {
      char32_t c;
      size_t bad;
      size_t len = tok::decode_utf8(s, i, c, bad);
      if (len == 0) return Value::boolean(false);
      i += len;
      bool ok;
      if (name == "isdigit") ok = c >= '0' && c <= '9' ? true : tok::is_number(c) && c < 0x80;
      else if (name == "isalpha") ok = tok::is_letter(c);
      else if (name == "isalnum") ok = tok::is_letter(c) || tok::is_number(c);
      else if (name == "isspace") ok = py_space(c);
      else {
        bool lower = tok::to_upper(c) != c, upper = tok::to_lower(c) != c;
        if (lower || upper) any_cased = true;
        ok = name == "islower" ? !upper : !lower;
      }
      if (!ok) return Value::boolean(false);
    }
    if (name == "islower" || name == "isupper") return Value::boolean(any_cased);
    return Value::boolean(true);
  }
  if (name == "splitlines") {
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
  throw ValueError(str("'str' object has no attribute '", name, "'"));
}

const std::set<std::string, std::less<>> kStrMethods = {
    "strip", "lstrip", "rstrip", "split", "startswith", "endswith", "upper", "lower", "title", "capitalize",
    "replace", "find", "rfind", "index", "count", "join", "isdigit", "isalpha", "isalnum", "isspace",
    "islower", "isupper", "splitlines"};
const std::set<std::string, std::less<>> kDictMethods = {"items", "keys", "values", "get"};
// Methods the sandbox refuses: they would mutate the caller's objects.
const std::set<std::string, std::less<>> kMutating = {"append", "extend", "insert", "pop", "remove", "clear",
                                                      "update", "setdefault", "popitem", "sort", "reverse"};

Value Renderer::get_attr(const Value& obj, const std::string& name, Pos at) {
  switch (obj.t) {
    case Value::T::kUndefined:
      fail(at, str("'", obj.s.empty() ? "value" : obj.s, "' is undefined (accessing attribute '", name, "')"));
    case Value::T::kStr:
      if (kStrMethods.count(name)) {
        Value self = obj;
        return Value::func([self, name](Args& a) { return string_method(self, name, a); });
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

bool run_test(const std::string& name, const Value& v, const Args& a, Renderer& r, Pos at);

Value do_filter(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at);

Value Renderer::filter(const Expr& e) {
  Value v = eval(*e.kids[0]);
  Args a = eval_args(e, 1);
  try {
    return do_filter(e.name, v, a, *this, e.at);
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

bool run_test(const std::string& name, const Value& v, const Args& a, Renderer& r, Pos at) {
  auto arg = [&]() -> const Value& {
    if (a.pos.empty()) r.fail(at, str("test '", name, "' needs an argument"));
    return a.pos[0];
  };
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "boolean") return v.t == Value::T::kBool;
  if (name == "true") return v.t == Value::T::kBool && v.b;
  if (name == "false") return v.t == Value::T::kBool && !v.b;
  if (name == "integer") return v.t == Value::T::kInt;
  if (name == "float") return v.t == Value::T::kFloat;
  if (name == "number") return v.is_number();
  if (name == "string") return v.is_str();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_str() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "sequence") return v.is_str() || v.is_list() || v.is_dict() || v.is_undefined();
  if (name == "callable") return v.t == Value::T::kFunc || v.is_undefined();  // Undefined has __call__
  if (name == "escaped") return false;
  if (name == "lower" || name == "upper") {
    // str(value).islower() / .isupper(): some cased character, none of the other case.
    Args none;
    Value r2 = string_method(Value::str(to_str(v)), name == "lower" ? "islower" : "isupper", none);
    return r2.b;
  }
  if (name == "even" || name == "odd" || name == "divisibleby") {
    // jinja2: value % 2 == 0, value % 2 == 1, value % num == 0.
    Value divisor = name == "divisibleby" ? arg() : Value::integer(2);
    Value rem = r.binary("%", v, divisor, at);
    return equal(rem, Value::integer(name == "odd" ? 1 : 0));
  }
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, arg());
  if (name == "ne" || name == "!=") return !equal(v, arg());
  if (name == "lt" || name == "<") return r.compare("<", v, arg(), at);
  if (name == "le" || name == "<=") return r.compare("<=", v, arg(), at);
  if (name == "gt" || name == ">") return r.compare(">", v, arg(), at);
  if (name == "ge" || name == ">=") return r.compare(">=", v, arg(), at);
  if (name == "in") return r.compare("in", v, arg(), at);
  if (name == "sameas") {
    const Value& o = arg();
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
  r.fail(at, str("unsupported construct: test '", name, "'"));
}

Value attr_path(const Value& v, const std::string& path, Renderer& r, Pos at) {
  Value cur = v;
  size_t i = 0;
  while (i <= path.size()) {
    size_t j = path.find('.', i);
    if (j == std::string::npos) j = path.size();
    std::string part = path.substr(i, j - i);
    bool digits = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    cur = digits ? r.get_item(cur, Value::integer(std::stoll(part)), at) : r.get_item(cur, Value::str(part), at);
    i = j + 1;
  }
  return cur;
}

int sort_cmp(const Value& a, const Value& b, bool case_sensitive, Renderer& r, Pos at) {
  if (a.is_str() && b.is_str() && !case_sensitive) {
    std::string x = py_case(a.s, 0), y = py_case(b.s, 0);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (r.compare("<", a, b, at)) return -1;
  if (r.compare("<", b, a, at)) return 1;
  return 0;
}

Value do_filter(const std::string& name, const Value& v, Args& a, Renderer& r, Pos at) {
  auto as_list = [&](const Value& x) -> List { return r.iterate(x, at); };
  if (name == "trim") return Value::str(py_strip(to_str(v), a.get(0, "chars"), true, true));
  if (name == "tojson") {
    // transformers' tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
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
  if (name == "length" || name == "count") {
    if (v.is_str()) return Value::integer(static_cast<int64_t>(Renderer::cp_count(v.s)));
    if (v.is_list()) return Value::integer(static_cast<int64_t>(v.list->size()));
    if (v.is_dict()) return Value::integer(static_cast<int64_t>(v.dict->items.size()));
    if (v.is_undefined()) return Value::integer(0);
    throw ValueError(str("object of type '", type_name(v), "' has no len()"));
  }
  if (name == "string") return Value::str(to_str(v));
  if (name == "safe" || name == "e" || name == "escape") {
    if (name == "safe") return v;
    return Value::str(html_escape(to_str(v)));
  }
  if (name == "upper") return Value::str(py_case(to_str(v), 1));
  if (name == "lower") return Value::str(py_case(to_str(v), 0));
  if (name == "title") {
    // jinja2's own title: words start after whitespace, '-', '(', '{', '[' or '<'; the
    // first character of each goes upper case and the rest lower case.
    std::string s = to_str(v), out, word;
    auto flush = [&] {
      if (!word.empty()) out += py_capitalize(word);
      word.clear();
    };
    size_t i = 0;
    while (i < s.size()) {
      char32_t c;
      size_t bad;
      size_t len = tok::decode_utf8(s, i, c, bad);
      if (len == 0) len = bad, c = tok::kReplacement;
      bool sep = py_space(c) || c == '-' || c == '(' || c == '{' || c == '[' || c == '<';
      if (sep) {
        flush();
        out.append(s, i, len);
      } else {
        word.append(s, i, len);
      }
      i += len;
    }
    flush();
    return Value::str(out);
  }
  if (name == "capitalize") return Value::str(py_capitalize(to_str(v)));
  if (name == "replace") {
    return Value::str(py_replace(to_str(v), to_str(need_str(a.get(0, "old"), "replace")),
                                 to_str(need_str(a.get(1, "new"), "replace")), int_arg(a.get(2, "count"), -1, "replace")));
  }
  if (name == "default" || name == "d") {
    const Value* dv = a.get(0, "default_value");
    bool boolean = a.get(1, "boolean") && truthy(*a.get(1, "boolean"));
    if (v.is_undefined() || (boolean && !truthy(v))) return dv ? *dv : Value::str("");
    return v;
  }
  if (name == "first" || name == "last") {
    List items = as_list(v);
    if (items.empty()) return Value::undefined(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return Value::make_list(as_list(v));
  if (name == "reverse") {
    if (v.is_str()) {
      List chars = as_list(v);
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->s;
      return Value::str(out);
    }
    List items = as_list(v);
    std::reverse(items.begin(), items.end());
    return Value::make_list(std::move(items));
  }
  if (name == "join") {
    std::string sep = a.get(0, "d") ? to_str(*a.get(0, "d")) : "";
    const Value* attr = a.get(1, "attribute");
    std::string out;
    bool first = true;
    for (auto& x : as_list(v)) {
      if (!first) out += sep;
      first = false;
      out += to_str(attr ? attr_path(x, to_str(*attr), r, at) : x);
    }
    return Value::str(out);
  }
  if ((name == "int" || name == "float") && v.is_undefined())
    throw ValueError(str("'", v.s.empty() ? "value" : v.s, "' is undefined"));
  if (name == "int") {
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
  if (name == "float") {
    if (v.is_number()) return Value::real(v.as_double());
    if (v.is_str()) {
      std::string s = py_strip(v.s, nullptr, true, true);
      char* end = nullptr;
      double x = std::strtod(s.c_str(), &end);
      if (!s.empty() && end == s.c_str() + s.size()) return Value::real(x);
    }
    return a.get(0, "default") ? *a.get(0, "default") : Value::real(0);
  }
  if (name == "abs") {
    if (v.t == Value::T::kInt) {
      if (v.i == INT64_MIN) throw ValueError("integer overflow");
      return Value::integer(v.i < 0 ? -v.i : v.i);
    }
    if (v.t == Value::T::kFloat) return Value::real(std::fabs(v.f));
    if (v.t == Value::T::kBool) return Value::integer(v.b);
    throw ValueError(str("bad operand type for abs(): '", type_name(v), "'"));
  }
  if (name == "round") {
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
  if (name == "items") {
    if (v.is_undefined()) return Value::make_list();
    if (!v.is_dict()) throw ValueError("items: expected a mapping");
    List out;
    for (auto& [k, x] : v.dict->items) out.push_back(Value::make_tuple({Value::str(k), x}));
    return Value::make_list(std::move(out));
  }
  if (name == "dictsort") {
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
  if (name == "sort") {
    bool rev = a.get(0, "reverse") && truthy(*a.get(0, "reverse"));
    bool cs = a.get(1, "case_sensitive") && truthy(*a.get(1, "case_sensitive"));
    const Value* attr = a.get(2, "attribute");
    List items = as_list(v);
    std::stable_sort(items.begin(), items.end(), [&](const Value& p, const Value& q) {
      Value x = attr ? attr_path(p, to_str(*attr), r, at) : p, y = attr ? attr_path(q, to_str(*attr), r, at) : q;
      int c = sort_cmp(x, y, cs, r, at);
      return rev ? c > 0 : c < 0;
    });
    return Value::make_list(std::move(items));
  }
  if (name == "unique") {
    List out;
    for (auto& x : as_list(v)) {
      if ((x.is_list() && !x.tuple) || x.is_dict()) throw ValueError(str("unhashable type: '", type_name(x), "'"));
      bool seen = false;
      for (auto& y : out)
        if (x.is_str() && y.is_str() ? py_case(x.s, 0) == py_case(y.s, 0) : equal(x, y)) seen = true;
      if (!seen) out.push_back(x);
    }
    return Value::make_list(std::move(out));
  }
  if (name == "min" || name == "max" || name == "sum") {
    List items = as_list(v);
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
  if ((name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr" || name == "map") &&
      !truthy(v))
    return Value::make_list();  // jinja2 iterates only `if value`
  if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
    bool by_attr = name.size() > 6;
    bool keep_if = name[0] == 's';
    size_t k = 0;
    std::string attr;
    if (by_attr) {
      if (a.pos.empty()) throw ValueError("missing attribute name");
      attr = to_str(a.pos[k++]);
    }
    std::string test_name = k < a.pos.size() ? to_str(a.pos[k++]) : "";
    if (!test_name.empty() && !kTests.count(test_name)) throw ValueError(str("unsupported test '", test_name, "'"));
    Args targs;
    targs.pos.assign(a.pos.begin() + static_cast<std::ptrdiff_t>(std::min(k, a.pos.size())), a.pos.end());
    List out;
    for (auto& x : as_list(v)) {
      Value subject = by_attr ? attr_path(x, attr, r, at) : x;
      bool pass = test_name.empty() ? truthy(subject) : run_test(test_name, subject, targs, r, at);
      if (pass == keep_if) out.push_back(x);
    }
    return Value::make_list(std::move(out));
  }
  if (name == "map") {
    List out;
    if (const Value* attr = a.get(99, "attribute")) {
      const Value* dflt = a.get(99, "default");
      for (auto& x : as_list(v)) {
        Value y = attr_path(x, to_str(*attr), r, at);
        out.push_back(y.is_undefined() && dflt ? *dflt : y);
      }
      return Value::make_list(std::move(out));
    }
    if (a.pos.empty()) throw ValueError("map: expected a filter name or attribute=");
    std::string fname = to_str(a.pos[0]);
    if (!kFilters.count(fname) || fname == "map") throw ValueError(str("unsupported filter '", fname, "'"));
    Args fargs;
    fargs.pos.assign(a.pos.begin() + 1, a.pos.end());
    fargs.kw = a.kw;
    for (auto& x : as_list(v)) out.push_back(do_filter(fname, x, fargs, r, at));
    return Value::make_list(std::move(out));
  }
  if (name == "attr") return r.get_attr(v, to_str(need_str(a.get(0, "name"), "attr")), at);
  if (name == "indent") {
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
  if (name == "wordcount") {
    // jinja2 counts \w+ runs.
    std::string s = to_str(v);
    int64_t n = 0;
    bool in_word = false;
    size_t i = 0;
    while (i < s.size()) {
      char32_t c;
      size_t bad;
      size_t len = tok::decode_utf8(s, i, c, bad);
      if (len == 0) len = bad, c = ' ';
      bool w = c == '_' || tok::is_letter(c) || tok::is_number(c);
      if (w && !in_word) ++n;
      in_word = w;
      i += len;
    }
    return Value::integer(n);
  }
  throw ValueError(str("unsupported filter '", name, "'"));
}

Value make_globals_range() {
  return Value::func([](Args& a) -> Value {
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
  });
}

}  // namespace

struct Template::Impl {
  std::string origin;
  Body body;
  std::set<std::string> root_stored;
};

namespace {
void collect_root_stored(const Body& body, std::set<std::string>& out) {
  for (const NodeP& n : body) {
    switch (n->k) {
      case Node::K::kSet:
        if (n->attr.empty()) out.insert(n->targets.begin(), n->targets.end());
        break;
      case Node::K::kSetBlock:
      case Node::K::kMacro: out.insert(n->targets[0]); break;
      default: break;  // if, for, macro and generation bodies are scopes of their own for jinja2
    }
  }
}

// Records on every for / macro node the names its body assigns directly.
void annotate_scopes(const Body& body) {
  for (const NodeP& n : body) {
    if (n->k == Node::K::kFor || n->k == Node::K::kMacro) collect_root_stored(n->body, n->stored);
    for (auto& [cond, b] : n->branches) annotate_scopes(b);
    annotate_scopes(n->body);
    annotate_scopes(n->else_body);
  }
}
}  // namespace

Template Template::parse(std::string_view source, const std::string& origin) {
  auto impl = std::make_shared<Impl>();
  impl->origin = origin;
  std::string clean;
  if (!tok::sanitize_utf8(source, clean)) throw FormatError(origin + ": template is not valid UTF-8");
  Lexer lexer(source, impl->origin);
  Parser parser(lexer.run(), impl->origin);
  impl->body = parser.parse_template();
  collect_root_stored(impl->body, impl->root_stored);
  annotate_scopes(impl->body);
  return Template(std::move(impl));
}

std::string Template::render(const nlohmann::ordered_json& vars) const {
  Renderer r(impl_->origin);
  r.root_stored = &impl_->root_stored;
  auto globals = std::make_shared<Dict>();
  globals->set("range", make_globals_range());
  globals->set("namespace", Value::func([](Args& a) -> Value {
    Value ns = Value::make_namespace();
    for (auto& p : a.pos) {
      if (!p.is_dict()) throw ValueError("namespace() takes a mapping or keyword arguments");
      for (auto& kv : p.dict->items) ns.dict->set(kv.first, kv.second);
    }
    for (auto& [k, v] : a.kw) ns.dict->set(k, v);
    return ns;
  }));
  globals->set("dict", Value::func([](Args& a) -> Value {
    Value d = Value::make_dict();
    for (auto& [k, v] : a.kw) d.dict->set(k, v);
    return d;
  }));
  globals->set("raise_exception", Value::func([](Args& a) -> Value {
    throw ValueError(a.pos.empty() ? std::string("raise_exception") : to_str(a.pos[0]));
  }));
  globals->set("strftime_now", Value::func([](Args& a) -> Value {
    if (a.pos.empty() || !a.pos[0].is_str()) throw ValueError("strftime_now expects a format string");
    std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[256];
    size_t n = std::strftime(buf, sizeof buf, a.pos[0].s.c_str(), &tm);
    return Value::str(std::string(buf, n));
  }));
  if (!vars.is_object()) throw ValueError("chat template variables must be a JSON object");
  auto ctx = std::make_shared<Dict>();
  for (auto it = vars.begin(); it != vars.end(); ++it) ctx->set(it.key(), Value::from_json(it.value()));
  r.frames.push_back(globals);
  r.frames.push_back(ctx);
  std::string out;
  try {
    r.render(impl_->body, out);
  } catch (const LoopControl&) {
    throw ValueError(impl_->origin + ": 'break' or 'continue' outside a loop");
  }
  return out;
}

}  // namespace rpg::jinja
