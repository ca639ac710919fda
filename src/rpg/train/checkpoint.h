// Training-state files: named tensors in one safetensors file (the trainer's exact fp32
// parameters, optimizer moments, reference weights) next to a JSON file of scalars. The
// trainer writes both inside an AtomicDir, so a checkpoint is complete or absent.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <string>

namespace rpg::train {

// Writes every tensor (contiguous CPU copies; F32, F64, BF16, F16, I64, I32, BOOL) to `path`.
// Throws IoError. Test hook point `checkpoint_write` (core/test_hook.h): half the data written.
void save_tensor_file(const std::filesystem::path& path, const std::map<std::string, at::Tensor>& tensors);
// Reads a file written by save_tensor_file. Throws IoError / FormatError naming the file.
std::map<std::string, at::Tensor> load_tensor_file(const std::filesystem::path& path);

}  // namespace rpg::train
