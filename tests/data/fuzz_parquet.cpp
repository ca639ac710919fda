// libFuzzer target for the dataset reader on arbitrary Parquet bytes (Arrow's reader plus
// rpg's schema check): no crash / UB / leak in rpg's code, and only rpg's typed errors come
// out. The corpus starts from small valid files in the paper's schema.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "rpg/core/error.h"
#include "rpg/data/dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view bytes(reinterpret_cast<const char*>(data), size);
  try {
    auto rows = rpg::data::read_parquet_bytes(bytes, "fuzz.parquet");
    for (const auto& r : rows)
      if (r.data_source.size() > size) std::abort();  // a value longer than the file: invented bytes
  } catch (const rpg::FormatError&) {
  }
  return 0;
}
