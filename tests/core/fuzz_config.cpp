// libFuzzer target: the YAML config loader and the override parser must turn any input
// into either a config or an rpg::Error, never a crash, hang or sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "rpg/core/config.h"
#include "rpg/core/error.h"

namespace {
struct Small {
  int64_t n = 1;
  double x = 0.5;
  bool flag = false;
  std::string s;
  std::vector<double> v;
  template <class V>
  void visit(V& vis) {
    vis("n", n, "");
    vis("x", x, "");
    vis("flag", flag, "");
    vis("s", s, "");
    vis("v", v, "");
  }
};
struct Top {
  Small a;
  std::optional<int64_t> k;
  template <class V>
  void visit(V& vis) {
    vis.section("a", a);
    vis("k", k, "");
    vis.ignored("plumbing", "");
  }
};
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  // The first line, if it looks like key=value, is also tried as an override.
  size_t nl = text.find('\n');
  std::string_view first = text.substr(0, nl);
  try {
    rpg::ConfigNode root = rpg::parse_yaml(text, "fuzz.yaml");
    if (first.find('=') != std::string_view::npos) rpg::apply_override(root, first);
    auto loaded = rpg::bind_config<Top>(root);
    (void)rpg::config_to_yaml(loaded.value);
  } catch (const rpg::Error&) {
  }
  return 0;
}
