// Exchanging tensors with Python oracles in tests (F64, F32, BF16, F16, I64, I32, BOOL),
// through rpg's one safetensors writer/reader (rpg/model/tensor_file.h). Python reads and
// writes them with safetensors.torch.{load_file,save_file}.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <string>

namespace rpg::test {

void save_tensors(const std::filesystem::path& path, const std::map<std::string, at::Tensor>& tensors);
std::map<std::string, at::Tensor> load_tensors(const std::filesystem::path& path);

}  // namespace rpg::test
