// The text of `rpg data show FILE`: path, row count, the file's schema, and the first rows
// as JSON objects (long strings shortened).
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>

namespace rpg::data {

// `rows` first rows are read in the paper's schema (FormatError as in read_parquet);
// strings longer than `max_chars` bytes are cut at a UTF-8 boundary and marked with "...".
std::string show_dataset(const std::filesystem::path& path, int64_t rows = 3, int64_t max_chars = 240);

}  // namespace rpg::data
