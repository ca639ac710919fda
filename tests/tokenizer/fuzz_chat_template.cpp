// libFuzzer target: any template source must parse into a template or a FormatError, and
// rendering a parsed template must give a string or an rpg::Error: no crash, hang,
// unbounded memory or sanitizer report.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/jinja/jinja.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view src(reinterpret_cast<const char*>(data), size);
  static const nlohmann::ordered_json vars = nlohmann::ordered_json::parse(R"({
    "bos_token": "<s>", "eos_token": "</s>", "add_generation_prompt": true, "tools": null,
    "messages": [
      {"role": "system", "content": "You are helpful."},
      {"role": "user", "content": "What is 2+2? 中文 😀"},
      {"role": "assistant", "content": "<think>add</think>4", "tool_calls": [
        {"type": "function", "function": {"name": "calc", "arguments": {"x": 1, "y": [1.5, null, true]}}}]},
      {"role": "tool", "content": "4"}
    ]})");
  try {
    auto t = rpg::jinja::Template::parse(src, "fuzz.jinja");
    (void)t.render(vars);
  } catch (const rpg::Error&) {
  }
  return 0;
}
