// docs/algorithms.md proves its claims by naming tests; every name it cites must exist.
// A citation is a backquoted `Suite.Name` glob (gtest filter syntax: * and ?), with or
// without the instantiation prefix of a parameterised suite ("Registered/EveryLoss.*").
// This binary's tests are listed by GoogleTest itself (parameter names included); the other
// test directories' by their TEST / TEST_F / TEST_P declarations.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "rpg/algo/advantage.h"
#include "rpg/algo/policy_loss.h"
#include "test_util.h"

namespace rpg::test {
namespace {

bool glob(const char* p, const char* s) {
  if (!*p) return !*s;
  if (*p == '*') return glob(p + 1, s) || (*s && glob(p, s + 1));
  if (*s && (*p == '?' || *p == *s)) return glob(p + 1, s + 1);
  return false;
}

struct Known {
  std::set<std::string> exact;     // Suite.Name (and Prefix/Suite.Name/param) of every test
  std::set<std::string> patterns;  // Suite.Name/ of TEST_P declared in other binaries' sources
};

Known known_tests() {
  Known k;
  const auto* unit = ::testing::UnitTest::GetInstance();
  for (int i = 0; i < unit->total_test_suite_count(); ++i) {
    const auto* suite = unit->GetTestSuite(i);
    std::string sname = suite->name();
    for (int j = 0; j < suite->total_test_count(); ++j) {
      std::string full = sname + "." + suite->GetTestInfo(j)->name();
      k.exact.insert(full);
      if (auto slash = sname.find('/'); slash != std::string::npos) k.exact.insert(full.substr(slash + 1));
    }
  }
  for (const auto& d : declared_tests()) {
    const std::string name = d.suite + "." + d.name;
    if (d.macro == "TEST_P")
      k.patterns.insert(name + "/");
    else
      k.exact.insert(name);
  }
  return k;
}

std::vector<std::string> citations(const std::filesystem::path& doc) {
  std::ifstream in(doc);
  std::stringstream text;
  text << in.rdbuf();
  std::string s = text.str();
  static const std::regex cite(R"(`((?:[A-Z]\w*/)?[A-Z]\w*\.[A-Za-z0-9_*?/]+)`)");
  std::vector<std::string> out;
  for (std::sregex_iterator it(s.begin(), s.end(), cite), end; it != end; ++it) out.push_back((*it)[1].str());
  return out;
}

bool resolves(const std::string& c, const Known& k) {
  for (const auto& name : k.exact)
    if (glob(c.c_str(), name.c_str())) return true;
  for (const auto& prefix : k.patterns) {
    if (glob(c.c_str(), prefix.substr(0, prefix.size() - 1).c_str())) return true;
    if (c.rfind(prefix, 0) == 0) return true;
    if (glob(c.c_str(), (prefix + "x").c_str())) return true;
  }
  return false;
}

TEST(Docs, AlgorithmsCitesOnlyTestsThatExist) {
  auto doc = source_dir() / "docs" / "algorithms.md";
  ASSERT_TRUE(std::filesystem::exists(doc)) << doc;
  auto known = known_tests();
  ASSERT_GT(known.exact.size(), 50u);
  auto cited = citations(doc);
  EXPECT_GT(cited.size(), 20u) << "docs/algorithms.md cites almost no tests";
  for (const auto& c : cited) EXPECT_TRUE(resolves(c, known)) << "docs/algorithms.md cites `" << c << "`: no such test";
  // The check itself can fail.
  EXPECT_FALSE(resolves("VerlParity.GspoAndCispo", known));
  EXPECT_FALSE(resolves("ExactGradient.*rpg_*_clip*", known));
  EXPECT_TRUE(resolves("ExactGradient.*rpg_fkl", known));
}

// Every name a config may give actor.policy_loss or algorithm.adv_estimator is documented
// (as `name`), so adding a registry line without its documentation fails here.
TEST(Docs, AlgorithmsDocumentsEveryRegisteredLossAndEstimator) {
  std::ifstream in(source_dir() / "docs" / "algorithms.md");
  std::stringstream text;
  text << in.rdbuf();
  const std::string doc = text.str();
  auto documented = [&](const std::string& name) { return doc.find("`" + name + "`") != std::string::npos; };
  ASSERT_FALSE(documented("no_such_loss_name"));
  for (const auto& name : algo::policy_loss_names())
    EXPECT_TRUE(documented(name)) << "docs/algorithms.md does not mention policy loss `" << name << "`";
  for (const auto& name : algo::advantage_names())
    EXPECT_TRUE(documented(name)) << "docs/algorithms.md does not mention advantage estimator `" << name << "`";
}

}  // namespace
}  // namespace rpg::test
