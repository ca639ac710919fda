// Chat templates against transformers' apply_chat_template. The oracle writes model
// directories holding the public Qwen2.5, Qwen3, Llama 3 and Llama 3.1 templates and a
// fixture template that uses every construct those templates use (the list is in
// tests/oracles/tokenizer_templates.py), renders many conversations with jinja2 and records
// the prompts; rpg must produce the same bytes, or raise where the template raises.
#include <gtest/gtest.h>

#include <fstream>
#include <map>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/jinja/jinja.h"
#include "rpg/tokenizer/tokenizer.h"
#include "chat_case.h"
#include "test_util.h"

namespace {

using json = nlohmann::ordered_json;
using rpg::tok::Tokenizer;

TEST(ChatTemplate, MatchesTransformersOnRealAndFixtureTemplates) {
  rpg::test::TempDir dir;
  rpg::test::run_oracle("tokenizer_chat_oracle.py", {dir.path().string()});
  std::map<std::string, Tokenizer> toks;
  std::map<std::string, int> rendered, raised;
  std::ifstream in(dir.path() / "chat_cases.jsonl");
  size_t n = 0;
  for (std::string line; std::getline(in, line); ++n) {
    json c = json::parse(line);
    std::string name = c["template"];
    if (!toks.count(name)) toks.emplace(name, Tokenizer::from_dir(dir.path() / name));
    const Tokenizer& tok = toks.at(name);
    SCOPED_TRACE(name + " case " + std::to_string(n) + ": " + c["messages"].dump());
    if (rpg::test::render_chat_case(tok, c, raised[name])) ++rendered[name];
  }
  EXPECT_GE(n, 140u);
  for (const char* name : {"qwen25", "qwen3", "llama3", "llama31", "constructs"}) EXPECT_GE(rendered[name], 8) << name;
  EXPECT_GE(raised["llama31"], 2);

  // The ChatMessage overload is the JSON one (checked above) with role/content objects.
  const Tokenizer& qwen = toks.at("qwen25");
  std::vector<rpg::tok::ChatMessage> msgs = {{"system", "S"}, {"user", "Q"}};
  json j = json::array({{{"role", "system"}, {"content", "S"}}, {{"role", "user"}, {"content", "Q"}}});
  EXPECT_EQ(qwen.apply_chat_template(msgs, true), qwen.apply_chat_template(j, true));
  EXPECT_NE(qwen.apply_chat_template(msgs, true), qwen.apply_chat_template(msgs, false));
}

// Unsupported constructs are rejected at parse time, naming the construct and position.
TEST(ChatTemplate, UnsupportedConstructsNameTheConstructAndPosition) {
  struct Bad {
    const char* src;
    const char* needle;
  };
  const Bad cases[] = {
      {"hello {% include 'x.j2' %}", "1:10: unsupported construct: 'include' tag"},
      {"{% extends 'base' %}", "1:4: unsupported construct: 'extends' tag"},
      {"line1\n  {{ x | wordwrap }}", "2:10: unsupported construct: filter 'wordwrap'"},
      {"{% if x is prime %}{% endif %}", "1:12: unsupported construct: test 'prime'"},
      {"{% for x in y recursive %}{% endfor %}", "unsupported construct: recursive for loop"},
      {"{{ f(*args) }}", "unsupported construct: *args"},
      {"{% filter upper %}x{% endfilter %}", "unsupported construct: 'filter' tag"},
      {"{% if x %}", "unexpected end of template, expected 'elif'"},
      {"{{ x ", "expected '}}'"},
      {"{# never closed", "missing end of comment tag"},
      {"{{ 'abc }}", "unterminated string literal"},
      {"{% for %}", "expected a name"},
      {"{{ (1, 2 }}", "unexpected '}'"},
  };
  for (const Bad& b : cases) {
    try {
      rpg::jinja::Template::parse(b.src, "t.jinja");
      ADD_FAILURE() << "no error for " << b.src;
    } catch (const rpg::FormatError& e) {
      std::string msg = e.what();
      EXPECT_NE(msg.find("t.jinja:"), std::string::npos) << msg;
      EXPECT_NE(msg.find(b.needle), std::string::npos) << b.src << " -> " << msg;
    }
  }
}

TEST(ChatTemplate, RuntimeErrorsAreValueErrors) {
  auto render = [](const char* src, json vars = json::object()) {
    return rpg::jinja::Template::parse(src, "t.jinja").render(vars);
  };
  EXPECT_THROW(render("{{ raise_exception('boom') }}"), rpg::ValueError);
  EXPECT_THROW(render("{{ missing.attr }}"), rpg::ValueError);
  EXPECT_THROW(render("{{ 1 + 'a' }}"), rpg::ValueError);
  EXPECT_THROW(render("{% set x = [] %}{{ x.append(1) }}"), rpg::ValueError);  // sandboxed
  EXPECT_THROW(render("{% set n = 1 %}{% set n.a = 2 %}"), rpg::ValueError);
  try {
    render("ok\n{{ raise_exception('bad role ' ~ 3) }}");
    ADD_FAILURE();
  } catch (const rpg::ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("t.jinja:2:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("bad role 3"), std::string::npos) << e.what();
  }
}

}  // namespace
