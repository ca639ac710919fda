// Differential test of the template interpreter: the oracle generates thousands of random
// templates from a grammar of the supported subset (expressions, filters, tests, methods,
// slicing, loops with loop variables and break / continue, set, namespace, whitespace
// control) and renders each with transformers' jinja2 environment. rpg must produce the
// same output, and must raise whenever jinja2 raises.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/jinja/jinja.h"
#include "test_util.h"

namespace {

using json = nlohmann::ordered_json;

TEST(JinjaDifferential, RandomTemplatesMatchJinja2) {
  rpg::test::TempDir dir;
  auto out = dir / "cases.jsonl";
  rpg::test::run_oracle("tokenizer_jinja_fuzz_oracle.py", {out.string(), "4000", "20261130"});
  std::ifstream in(out);
  size_t n = 0, rendered = 0, raised = 0, bad = 0;
  for (std::string line; std::getline(in, line); ++n) {
    json c = json::parse(line);
    std::string src = c["template"];
    bool want_error = c.contains("error");
    std::string got, err;
    bool threw = false;
    try {
      got = rpg::jinja::Template::parse(src, "t").render(c["vars"]);
    } catch (const rpg::Error& e) {
      threw = true;
      err = e.what();
    }
    if (want_error) {
      ++raised;
      if (!threw && ++bad <= 10)
        ADD_FAILURE() << "jinja2 raised " << c["error"] << " but rpg rendered " << json(got).dump() << "\n  template: " << json(src).dump();
      continue;
    }
    ++rendered;
    std::string want = c["expected"];
    if (threw) {
      if (++bad <= 10) ADD_FAILURE() << "rpg raised " << err << "\n  jinja2: " << json(want).dump() << "\n  template: " << json(src).dump();
    } else if (got != want) {
      if (++bad <= 10)
        ADD_FAILURE() << "output differs\n  jinja2: " << json(want).dump() << "\n  rpg:    " << json(got).dump()
                      << "\n  template: " << json(src).dump();
    }
  }
  EXPECT_EQ(bad, 0u) << bad << " of " << n << " templates differ";
  EXPECT_GE(rendered, 1000u);
  EXPECT_GE(raised, 500u);
}

}  // namespace
