#include "rpg/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "rpg/core/error.h"

namespace rpg::model::safetensors {
namespace {

struct DTypeEntry {
  DType dtype;
  std::string_view name;
  size_t size;
};
constexpr DTypeEntry kDTypes[] = {
    {DType::kBool, "BOOL", 1}, {DType::kU8, "U8", 1},     {DType::kI8, "I8", 1},
    {DType::kI16, "I16", 2},   {DType::kU16, "U16", 2},   {DType::kI32, "I32", 4},
    {DType::kU32, "U32", 4},   {DType::kI64, "I64", 8},   {DType::kU64, "U64", 8},
    {DType::kF16, "F16", 2},   {DType::kBF16, "BF16", 2}, {DType::kF32, "F32", 4},
    {DType::kF64, "F64", 8},   {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
};

// The reference implementation caps the header at 100 MB; a larger claim is corruption.
constexpr uint64_t kMaxHeader = 100'000'000;

}  // namespace

size_t dtype_size(DType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.size;
  return 0;
}

std::string_view dtype_name(DType d) {
  for (const auto& e : kDTypes)
    if (e.dtype == d) return e.name;
  return "?";
}

std::optional<DType> dtype_from_name(std::string_view name) {
  for (const auto& e : kDTypes)
    if (e.name == name) return e.dtype;
  return std::nullopt;
}

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorInfo* Header::find(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return &t;
  return nullptr;
}

Header parse(const uint8_t* data, size_t size, const std::string& file) {
  using nlohmann::json;
  auto fail = [&](const std::string& what) -> FormatError { return FormatError(str(file, ": ", what)); };
  if (size < 8) throw fail(str("truncated safetensors file: ", size, " bytes, expected at least 8"));
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | data[i];
  if (n > size - 8)
    throw fail(str("header length ", n, " extends beyond the end of the file (", size - 8, " bytes after the prefix)"));
  if (n > kMaxHeader) throw fail(str("header length ", n, " exceeds the 100 MB limit"));
  Header h;
  h.data_start = 8 + n;
  const uint64_t data_size = size - h.data_start;

  json root;
  try {
    root = json::parse(data + 8, data + 8 + n);
  } catch (const json::exception& e) {
    throw fail(str("header is not valid JSON: ", e.what()));
  }
  if (!root.is_object()) throw fail("header is not a JSON object");

  for (auto it = root.begin(); it != root.end(); ++it) {
    const std::string& name = it.key();
    const json& v = it.value();
    if (name == "__metadata__") {
      if (!v.is_object()) throw fail("__metadata__ is not an object");
      for (auto m = v.begin(); m != v.end(); ++m) {
        if (!m.value().is_string()) throw fail(str("__metadata__ value of '", m.key(), "' is not a string"));
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    auto tfail = [&](const std::string& what) { return fail(str("tensor '", name, "': ", what)); };
    if (!v.is_object()) throw tfail("entry is not an object");
    TensorInfo t;
    t.name = name;
    auto dt = v.find("dtype");
    if (dt == v.end() || !dt->is_string()) throw tfail("missing or non-string dtype");
    auto parsed = dtype_from_name(dt->get<std::string>());
    if (!parsed) throw tfail(str("unknown dtype ", dt->dump()));
    t.dtype = *parsed;
    auto sh = v.find("shape");
    if (sh == v.end() || !sh->is_array()) throw tfail("missing or non-list shape");
    // A crafted shape can overflow the byte count: track overflow instead of wrapping.
    uint64_t bytes = dtype_size(t.dtype);
    bool zero = false, overflow = false;
    for (const auto& d : *sh) {
      if (!d.is_number_unsigned()) throw tfail(str("shape entry ", d.dump(), " is not a non-negative integer"));
      uint64_t dim = d.get<uint64_t>();
      if (dim > (uint64_t{1} << 62)) throw tfail(str("shape entry ", dim, " is too large"));
      t.shape.push_back(static_cast<int64_t>(dim));
      if (dim == 0) zero = true;
      if (__builtin_mul_overflow(bytes, dim, &bytes)) overflow = true;
    }
    if (zero) bytes = 0, overflow = false;
    auto off = v.find("data_offsets");
    if (off == v.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
      throw tfail("data_offsets must be a list of two non-negative integers");
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.begin > t.end) throw tfail(str("data_offsets [", t.begin, ", ", t.end, "] are reversed"));
    if (t.end > data_size)
      throw tfail(str("data_offsets [", t.begin, ", ", t.end, "] extend beyond the data section (", data_size,
                      " bytes)"));
    if (overflow || t.end - t.begin != bytes)
      throw tfail(str("data_offsets [", t.begin, ", ", t.end, "] hold ", t.end - t.begin, " bytes, but dtype ",
                      dtype_name(t.dtype), " and the shape need ", overflow ? std::string("more than 2^64") : str(bytes)));
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(),
            [](const TensorInfo& a, const TensorInfo& b) { return a.begin != b.begin ? a.begin < b.begin : a.end < b.end; });
  // Empty tensors occupy no bytes and may sit anywhere; among the others, each must
  // start at or after the furthest end seen so far.
  const TensorInfo* furthest = nullptr;
  for (const auto& t : h.tensors) {
    if (t.end == t.begin) continue;
    if (furthest && t.begin < furthest->end)
      throw fail(str("tensor '", t.name, "': data_offsets [", t.begin, ", ", t.end, "] overlap tensor '",
                     furthest->name, "' [", furthest->begin, ", ", furthest->end, "]"));
    if (!furthest || t.end > furthest->end) furthest = &t;
  }
  return h;
}

std::string serialize_header(const std::vector<TensorInfo>& tensors,
                             const std::map<std::string, std::string>& metadata) {
  nlohmann::ordered_json root = nlohmann::ordered_json::object();
  if (!metadata.empty()) root["__metadata__"] = metadata;
  for (const auto& t : tensors) {
    root[t.name] = {{"dtype", std::string(dtype_name(t.dtype))}, {"shape", t.shape}, {"data_offsets", {t.begin, t.end}}};
  }
  std::string text = root.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  std::string out(8, '\0');
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  return out + text;
}

MappedFile::MappedFile(const std::filesystem::path& path) : path_(path.string()) {
  int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw IoError(str("cannot open ", path_, ": ", std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    int e = errno;
    ::close(fd);
    throw IoError(str("cannot stat ", path_, ": ", std::strerror(e)));
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      int e = errno;
      ::close(fd);
      throw IoError(str("cannot mmap ", path_, ": ", std::strerror(e)));
    }
    data_ = static_cast<const uint8_t*>(p);
  }
  ::close(fd);  // the mapping keeps the file referenced
}

MappedFile::~MappedFile() {
  if (data_) ::munmap(const_cast<uint8_t*>(data_), size_);
}

void MappedFile::drop(uint64_t offset, uint64_t length) const {
  if (!data_ || length == 0) return;
  const uint64_t page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  // Only whole pages inside the range: neighbours may still be needed.
  uint64_t a = (offset + page - 1) / page * page, b = std::min<uint64_t>(offset + length, size_) / page * page;
  if (b > a) ::madvise(const_cast<uint8_t*>(data_) + a, b - a, MADV_DONTNEED);
}

}  // namespace rpg::model::safetensors
