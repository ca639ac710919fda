// libFuzzer target: config.json parsing. Any text becomes either a ModelConfig whose
// derived quantities (parameter list, count, description, re-serialisation) can be
// computed without overflow or crash, or an rpg::FormatError.
#include <cstddef>
#include <cstdint>
#include <string>

#include "rpg/core/error.h"
#include "rpg/model/config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  try {
    auto c = rpg::model::ModelConfig::from_json(text, "fuzz/config.json");
    // Walking the parameter list costs O(layers): bound it so one input cannot take long.
    if (c.num_hidden_layers <= 256) {
      (void)c.num_parameters();
      (void)rpg::model::describe(c);
    }
    (void)c.to_json("bfloat16");
  } catch (const rpg::FormatError&) {
  }
  return 0;
}
