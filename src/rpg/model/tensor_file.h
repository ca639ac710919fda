// Named tensors to and from one safetensors file: the single tensor writer of rpg (model
// weight shards, training state, tests' exchange files with Python) and its one dtype map.
// The format itself (header parsing and serialisation, torch-free) is safetensors.h.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "rpg/model/safetensors.h"

namespace rpg::model {

// The dtypes rpg reads and writes: F64, F32, BF16, F16, I64, I32, BOOL.
std::optional<at::ScalarType> torch_dtype(safetensors::DType d);
std::optional<safetensors::DType> file_dtype(at::ScalarType t);

struct TensorFileOptions {
  // Convert every tensor to this dtype while writing (one tensor at a time, so writing
  // never holds a second copy of a model); default: each tensor's own dtype.
  std::optional<at::ScalarType> dtype;
  std::map<std::string, std::string> metadata;  // the header's "__metadata__"
  // Called after each tensor's bytes are written and flushed (argument: tensors written so
  // far); kill-and-resume tests stop a process there (core/test_hook.h).
  std::function<void(size_t)> after_tensor;
};

// Writes the tensors, in this order, to `path` (a plain write: callers write inside an
// AtomicDir or to a temporary name). Throws ValueError for a dtype outside the map, IoError
// when the file cannot be written.
void write_tensor_file(const std::filesystem::path& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const TensorFileOptions& options = {});
std::vector<std::pair<std::string, at::Tensor>> as_list(const std::map<std::string, at::Tensor>& tensors);

// Reads every tensor of a file into CPU tensors. Throws IoError / FormatError naming the
// file (and the tensor for a dtype outside the map).
std::map<std::string, at::Tensor> read_tensor_file(const std::filesystem::path& path);

}  // namespace rpg::model
