// Parser of the chat-template engine: recursive descent with jinja2's operator precedence.
// Filters and tests outside the supported set are rejected here, with their position.
#pragma once

#include <string>
#include <vector>

#include "rpg/jinja/ast.h"
#include "rpg/jinja/lexer.h"

namespace rpg::jinja {

// Throws FormatError "<origin>:<line>:<col>: <reason>".
Body parse(std::vector<Token> toks, const std::string& origin);

}  // namespace rpg::jinja
