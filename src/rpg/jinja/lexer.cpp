#include "rpg/jinja/lexer.h"

#include <algorithm>
#include <cctype>

#include "rpg/core/error.h"
#include "rpg/core/text.h"
#include "rpg/jinja/value.h"

namespace rpg::jinja {

namespace {

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
    return rstrip_codepoints(src_, from, end, py_space);
  }
  size_t lstrip_pos(size_t from) const {
    std::string_view rest = std::string_view(src_).substr(std::min(from, src_.size()));
    return from + for_each_codepoint(rest, [](const CodePoint& c) { return py_space(c.cp); }, InvalidUtf8::kStop);
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
        case 'x': append_utf8(out, hex(2)); break;
        case 'u': append_utf8(out, hex(4)); break;
        case 'U': {
          char32_t v = hex(8);
          if (v > 0x10FFFF) fail(at, "illegal Unicode character in string literal");
          append_utf8(out, v);
          break;
        }
        case 'N': fail(at, "unsupported construct: \\N{...} escape");
        default:
          if (e >= '0' && e <= '7') {
            char32_t v = static_cast<char32_t>(e - '0');
            for (int k = 0; k < 2 && i < src_.size() && src_[i] >= '0' && src_[i] <= '7'; ++k, ++i)
              v = v * 8 + static_cast<char32_t>(src_[i] - '0');
            append_utf8(out, v);
          } else {
            out += '\\';
            out += e;
          }
      }
    }
    std::string valid;
    if (sanitize_utf8(out, valid)) valid = std::move(out);
    toks_.push_back({Tk::kString, std::move(valid), at.line, at.col});
    return i + 1;
  }

  std::string src_;
  const std::string& origin_;
  std::vector<Token> toks_;
};

}  // namespace

std::vector<Token> lex(std::string_view src, const std::string& origin) { return Lexer(src, origin).run(); }

}  // namespace rpg::jinja
