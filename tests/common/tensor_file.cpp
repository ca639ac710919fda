#include "tensor_file.h"

#include "rpg/model/tensor_file.h"

namespace rpg::test {

void save_tensors(const std::filesystem::path& path, const std::map<std::string, at::Tensor>& tensors) {
  model::write_tensor_file(path, model::as_list(tensors));
}

std::map<std::string, at::Tensor> load_tensors(const std::filesystem::path& path) {
  return model::read_tensor_file(path);
}

}  // namespace rpg::test
