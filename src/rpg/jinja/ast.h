// Syntax tree of a chat template, produced by the parser and walked by the renderer.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "rpg/jinja/lexer.h"
#include "rpg/jinja/value.h"

namespace rpg::jinja {

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

}  // namespace rpg::jinja
