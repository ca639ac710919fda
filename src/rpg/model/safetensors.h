// The safetensors file format, torch-free (so its parser can be fuzzed with clang):
//   [u64 little-endian N][N bytes of JSON header][data]
// The header maps tensor names to {dtype, shape, data_offsets: [begin, end)} relative to
// the start of the data section, plus an optional "__metadata__" string map.
// Parsing validates everything a reader later trusts: the header length against the file,
// each dtype, shape, and byte range (inside the data, size = numel * itemsize, no two
// tensors overlapping). Every failure is an rpg::FormatError naming the file and tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rpg::model::safetensors {

enum class DType { kBool, kU8, kI8, kI16, kU16, kI32, kU32, kI64, kU64, kF16, kBF16, kF32, kF64, kF8E4M3, kF8E5M2 };

size_t dtype_size(DType d);
std::string_view dtype_name(DType d);  // "F32", "BF16", ...
std::optional<DType> dtype_from_name(std::string_view name);

struct TensorInfo {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // byte range relative to the data section
  int64_t numel() const;
};

struct Header {
  uint64_t data_start = 0;                    // 8 + header length: where offsets count from
  std::vector<TensorInfo> tensors;            // in file (offset) order
  std::map<std::string, std::string> metadata;
  const TensorInfo* find(std::string_view name) const;
};

// Parses and validates the header of a safetensors file whose complete bytes are
// [data, data + size). `file` names it in errors. Never reads outside the buffer.
Header parse(const uint8_t* data, size_t size, const std::string& file);

// The bytes that precede the data section for these tensors (their offsets must already
// be set, contiguous from 0): length prefix + JSON, padded with spaces to a multiple of 8
// so that every tensor stays 8-byte aligned when the data is written after it.
std::string serialize_header(const std::vector<TensorInfo>& tensors,
                             const std::map<std::string, std::string>& metadata);

// A read-only, private memory map of a whole file. Pages are faulted in on demand and
// belong to the page cache, so mapping a checkpoint costs no process memory until read;
// drop() tells the kernel a range is no longer needed once it has been copied elsewhere.
class MappedFile {
 public:
  explicit MappedFile(const std::filesystem::path& path);  // throws IoError
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  void drop(uint64_t offset, uint64_t length) const;

 private:
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace rpg::model::safetensors
