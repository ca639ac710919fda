#include "rpg/train/checkpoint.h"

#include <ATen/ATen.h>

#include <cstring>
#include <fstream>

#include "rpg/core/error.h"
#include "rpg/core/test_hook.h"
#include "rpg/model/safetensors.h"

namespace rpg::train {
namespace st = model::safetensors;

namespace {

const std::vector<std::pair<at::ScalarType, st::DType>>& dtype_map() {
  static const std::vector<std::pair<at::ScalarType, st::DType>> m = {
      {at::kFloat, st::DType::kF32}, {at::kDouble, st::DType::kF64}, {at::kBFloat16, st::DType::kBF16},
      {at::kHalf, st::DType::kF16},  {at::kLong, st::DType::kI64},   {at::kInt, st::DType::kI32},
      {at::kBool, st::DType::kBool}};
  return m;
}

}  // namespace

void save_tensor_file(const std::filesystem::path& path, const std::map<std::string, at::Tensor>& tensors) {
  std::vector<st::TensorInfo> infos;
  std::vector<at::Tensor> data;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().cpu().contiguous();
    st::TensorInfo info;
    info.name = name;
    bool found = false;
    for (const auto& [a, s] : dtype_map())
      if (a == c.scalar_type()) info.dtype = s, found = true;
    if (!found) throw ValueError(str("training state: tensor '", name, "' has an unsupported dtype"));
    info.shape = c.sizes().vec();
    info.begin = offset;
    info.end = offset + static_cast<uint64_t>(c.numel()) * c.element_size();
    offset = info.end;
    infos.push_back(std::move(info));
    data.push_back(std::move(c));
  }
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  if (!out) throw IoError(str("cannot create ", path.string()));
  const std::string header = st::serialize_header(infos, {});
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  for (size_t i = 0; i < data.size(); ++i) {
    const auto& c = data[i];
    out.write(static_cast<const char*>(c.data_ptr()), static_cast<std::streamsize>(c.numel() * c.element_size()));
    if (i == data.size() / 2) {
      // Kill-and-resume tests die here, the file half on disk, to prove that such a
      // checkpoint is never picked up (test_hook.h).
      out.flush();
      test_hook::kill_point("checkpoint_write");
    }
  }
  out.flush();
  if (!out) throw IoError(str("cannot write ", path.string()));
}

std::map<std::string, at::Tensor> load_tensor_file(const std::filesystem::path& path) {
  st::MappedFile file(path);
  st::Header h = st::parse(file.data(), file.size(), path.string());
  std::map<std::string, at::Tensor> out;
  for (const auto& info : h.tensors) {
    at::ScalarType type = at::kFloat;
    bool found = false;
    for (const auto& [a, s] : dtype_map())
      if (s == info.dtype) type = a, found = true;
    if (!found)
      throw FormatError(str(path.string(), ": tensor '", info.name, "' has dtype ", st::dtype_name(info.dtype),
                            ", not one rpg writes"));
    at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(type));
    std::memcpy(t.data_ptr(), file.data() + h.data_start + info.begin, info.end - info.begin);
    out.emplace(info.name, std::move(t));
  }
  return out;
}

}  // namespace rpg::train
