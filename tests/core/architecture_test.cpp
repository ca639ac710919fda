// docs/architecture.md is held to the code: its dependency table and its layer diagram must be
// the module graph that the sources' #include "rpg/<module>/..." lines draw, and every module's
// CMake file must declare exactly those modules (a module links what it includes, nothing more).
#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "rpg/core/io.h"
#include "test_util.h"

namespace rpg::test {
namespace {

namespace fs = std::filesystem;
using Graph = std::map<std::string, std::set<std::string>>;

std::string show(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
  return "{" + out + "}";
}

std::set<std::string> modules() {
  std::set<std::string> out;
  for (const auto& e : fs::directory_iterator(source_dir() / "src" / "rpg"))
    if (e.is_directory()) out.insert(e.path().filename().string());
  return out;
}

// Module -> the other modules its headers and sources include.
Graph include_graph() {
  static const std::regex inc(R"(#\s*include\s*"rpg/(\w+)/)");
  Graph g;
  for (const auto& m : modules()) {
    g[m];
    for (const auto& e : fs::recursive_directory_iterator(source_dir() / "src" / "rpg" / m)) {
      const std::string ext = e.path().extension().string();
      if (ext != ".h" && ext != ".cpp") continue;
      const std::string text = read_file(e.path());
      for (std::sregex_iterator it(text.begin(), text.end(), inc), end; it != end; ++it)
        if ((*it)[1] != m) g[m].insert((*it)[1]);
    }
  }
  return g;
}

// The module a CMake target name belongs to: rpg_<module> or rpg_<module>_<part>.
std::string module_of_target(const std::string& target, const std::set<std::string>& mods) {
  if (target.rfind("rpg_", 0) != 0) return "";
  const std::string rest = target.substr(4);
  for (const auto& m : mods)
    if (rest == m || rest.rfind(m + "_", 0) == 0) return m;
  return "";
}

// Module -> the modules its CMakeLists.txt links: rpg_add_library(... DEPS ...) and
// target_link_libraries(<target> ...).
Graph cmake_graph() {
  const auto mods = modules();
  static const std::regex call(R"((rpg_add_library|target_link_libraries)\s*\(([^)]*)\))");
  Graph g;
  for (const auto& m : mods) {
    g[m];
    std::string text = read_file(source_dir() / "src" / "rpg" / m / "CMakeLists.txt");
    text = std::regex_replace(text, std::regex("#[^\n]*"), "");
    for (std::sregex_iterator it(text.begin(), text.end(), call), end; it != end; ++it) {
      std::istringstream args((*it)[2].str());
      std::vector<std::string> words;
      for (std::string w; args >> w;) words.push_back(w);
      size_t from = 1;  // target_link_libraries(<target> ...)
      if ((*it)[1] == "rpg_add_library") {
        from = words.size();
        for (size_t i = 0; i < words.size(); ++i)
          if (words[i] == "DEPS") from = i + 1;
      }
      for (size_t i = from; i < words.size(); ++i) {
        if (words[i] == "TORCH" || words[i] == "SOURCES") break;
        const std::string dep = module_of_target(words[i], mods);
        if (!dep.empty() && dep != m) g[m].insert(dep);
      }
    }
  }
  return g;
}

std::string architecture_md() { return read_file(source_dir() / "docs" / "architecture.md"); }

std::string trim(std::string s) {
  while (!s.empty() && (s.back() == ' ' || s.back() == '`')) s.pop_back();
  size_t i = 0;
  while (i < s.size() && (s[i] == ' ' || s[i] == '`')) ++i;
  return s.substr(i);
}

std::vector<std::string> split_commas(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string part; std::getline(in, part, ',');) out.push_back(trim(part));
  return out;
}

// The "| module | depends on |" table: module -> modules (parenthesised notes dropped).
Graph doc_table() {
  const auto mods = modules();
  std::istringstream in(architecture_md());
  Graph g;
  bool inside = false;
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("| module | depends on |", 0) == 0) {
      inside = true;
      continue;
    }
    if (!inside) continue;
    if (line.rfind("|", 0) != 0) break;
    if (line.rfind("|---", 0) == 0) continue;
    const size_t bar = line.find('|', 1), end = line.find('|', bar + 1);
    const std::string left = line.substr(1, bar - 1);
    std::string right = line.substr(bar + 1, end - bar - 1);
    right = std::regex_replace(right, std::regex(R"(\([^)]*\))"), "");
    std::set<std::string> deps;
    for (const auto& d : split_commas(right))
      if (mods.count(d)) deps.insert(d);
    for (const auto& m : split_commas(left)) g[m] = deps;
  }
  return g;
}

// The diagram: the first code block, one layer per line, top first; a line's leading words
// that name modules are its layer.
std::vector<std::set<std::string>> doc_layers() {
  const auto mods = modules();
  const std::string md = architecture_md();
  const size_t open = md.find("```\n"), close = md.find("```", open + 4);
  std::istringstream in(md.substr(open + 4, close - open - 4));
  std::vector<std::set<std::string>> layers;
  for (std::string line; std::getline(in, line);) {
    std::istringstream words(line);
    std::set<std::string> layer;
    for (std::string w; words >> w && mods.count(w);) layer.insert(w);
    if (!layer.empty()) layers.push_back(layer);
  }
  return layers;
}

TEST(Architecture, CMakeDeclaresExactlyTheModulesEachModuleIncludes) {
  const Graph inc = include_graph(), cm = cmake_graph();
  ASSERT_GE(inc.size(), 10u);
  for (const auto& [m, deps] : inc) EXPECT_EQ(show(cm.at(m)), show(deps)) << "src/rpg/" << m << "/CMakeLists.txt vs its #includes";
}

TEST(Architecture, TheDocsTableIsTheIncludeGraph) {
  const Graph inc = include_graph(), doc = doc_table();
  for (const auto& [m, deps] : inc) {
    ASSERT_TRUE(doc.count(m)) << "docs/architecture.md: no row for module " << m;
    EXPECT_EQ(show(doc.at(m)), show(deps)) << "docs/architecture.md's row for " << m;
  }
  for (const auto& [m, deps] : doc) EXPECT_TRUE(inc.count(m)) << "docs/architecture.md: a row for " << m << ", no such module";
}

TEST(Architecture, TheDiagramHasEveryModuleOnceAndEdgesPointDown) {
  const Graph inc = include_graph();
  const auto layers = doc_layers();
  std::map<std::string, size_t> level;  // 0 = top
  for (size_t i = 0; i < layers.size(); ++i)
    for (const auto& m : layers[i]) {
      EXPECT_FALSE(level.count(m)) << "docs/architecture.md's diagram shows " << m << " twice";
      level[m] = i;
    }
  for (const auto& [m, deps] : inc) {
    ASSERT_TRUE(level.count(m)) << "docs/architecture.md's diagram omits module " << m;
    for (const auto& d : deps)
      EXPECT_GT(level[d], level[m]) << "docs/architecture.md's diagram: " << m << " uses " << d
                                    << ", which must be on a line below it";
  }
}

// The "How to add" steps name the tests that hold them ([`Suite.Name`], `Prefix/Suite.*`, or
// `Suite.*`): each must be a test declared under tests/.
TEST(Architecture, HowToAddCitesTestsThatExist) {
  std::set<std::string> tests, suites;
  for (const auto& d : declared_tests()) {
    tests.insert(d.suite + "." + d.name);
    suites.insert(d.suite);
  }
  const std::string md = architecture_md();
  const std::string howto = md.substr(md.find("## How to add"));
  static const std::regex cite(R"(\[`([^`\]]+)`)");
  size_t cited = 0;
  for (std::sregex_iterator it(howto.begin(), howto.end(), cite), end; it != end; ++it) {
    std::string name = (*it)[1].str();
    if (const size_t slash = name.find('/'); slash != std::string::npos) name = name.substr(slash + 1);
    ++cited;
    if (name.size() > 2 && name.compare(name.size() - 2, 2, ".*") == 0)
      EXPECT_TRUE(suites.count(name.substr(0, name.size() - 2))) << "docs/architecture.md cites `" << name << "`";
    else
      EXPECT_TRUE(tests.count(name)) << "docs/architecture.md cites `" << name << "`: no such test";
  }
  EXPECT_GE(cited, 6u);
}

TEST(Architecture, DependenciesHaveNoCycle) {
  const Graph inc = include_graph();
  std::map<std::string, int> state;  // 1 visiting, 2 done
  std::function<void(const std::string&, std::string)> visit = [&](const std::string& m, std::string path) {
    if (state[m] == 2) return;
    ASSERT_NE(state[m], 1) << "dependency cycle: " << path;
    state[m] = 1;
    for (const auto& d : inc.at(m)) visit(d, path + " -> " + d);
    state[m] = 2;
  };
  for (const auto& [m, deps] : inc) visit(m, m);
}

}  // namespace
}  // namespace rpg::test
