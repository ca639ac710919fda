// libFuzzer target: the safetensors header parser turns any bytes into either a header
// whose every tensor lies inside the buffer without overlap, or an rpg::FormatError;
// never a crash, hang, or sanitizer report.
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "rpg/core/error.h"
#include "rpg/model/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  namespace st = rpg::model::safetensors;
  try {
    st::Header h = st::parse(data, size, "fuzz.safetensors");
    // The guarantees the loader relies on before it touches tensor bytes.
    if (h.data_start > size) std::abort();
    uint64_t prev_end = 0;
    for (const auto& t : h.tensors) {
      if (t.begin > t.end || t.end > size - h.data_start) std::abort();
      if (t.end - t.begin != static_cast<uint64_t>(t.numel()) * st::dtype_size(t.dtype)) std::abort();
      if (t.end > t.begin && t.begin < prev_end) std::abort();
      if (t.end > t.begin) prev_end = t.end;
      volatile uint8_t last = t.end > t.begin ? data[h.data_start + t.end - 1] : 0;
      (void)last;
    }
    (void)st::serialize_header(h.tensors, h.metadata);
  } catch (const rpg::FormatError&) {
  }
  return 0;
}
