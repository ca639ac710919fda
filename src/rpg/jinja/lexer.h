// Lexer of the chat-template engine. Follows jinja2's lexer with the options transformers
// uses: trim_blocks (drop the first newline after a block or comment tag), lstrip_blocks
// (drop spaces and tabs before a block or comment tag that starts a line), '-' / '+'
// whitespace control, newlines normalised to \n and one trailing newline of the source
// dropped.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace rpg::jinja {

enum class Tk { kData, kVarBegin, kVarEnd, kBlockBegin, kBlockEnd, kName, kString, kInt, kFloat, kOp, kEof };

struct Token {
  Tk type;
  std::string text;  // data, name, decoded string, operator, number spelling
  int line, col;
};

struct Pos {
  int line, col;
};

// The tokens of `src` (valid UTF-8), ending with kEof. Throws FormatError
// "<origin>:<line>:<col>: <reason>".
std::vector<Token> lex(std::string_view src, const std::string& origin);

}  // namespace rpg::jinja
