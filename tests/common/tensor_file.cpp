#include "tensor_file.h"

#include <ATen/ATen.h>

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

namespace rpg::test {
namespace {

const std::map<at::ScalarType, std::string>& dtype_names() {
  static const std::map<at::ScalarType, std::string> m = {
      {at::kDouble, "F64"}, {at::kFloat, "F32"}, {at::kBFloat16, "BF16"}, {at::kHalf, "F16"},
      {at::kLong, "I64"},   {at::kInt, "I32"},   {at::kBool, "BOOL"}};
  return m;
}

}  // namespace

void save_tensors(const std::filesystem::path& path, const std::map<std::string, at::Tensor>& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    at::Tensor c = t.detach().cpu().contiguous();
    auto it = dtype_names().find(c.scalar_type());
    if (it == dtype_names().end()) throw std::invalid_argument("save_tensors: unsupported dtype for " + name);
    size_t bytes = static_cast<size_t>(c.numel()) * c.element_size();
    header[name] = {{"dtype", it->second},
                    {"shape", c.sizes().vec()},
                    {"data_offsets", {data.size(), data.size() + bytes}}};
    data.append(static_cast<const char*>(c.data_ptr()), bytes);
  }
  std::string h = header.dump();
  h.append((8 - h.size() % 8) % 8, ' ');
  uint64_t n = h.size();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&n), 8);
  out << h << data;
  if (!out) throw std::runtime_error("save_tensors: cannot write " + path.string());
}

std::map<std::string, at::Tensor> load_tensors(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("load_tensors: cannot open " + path.string());
  std::stringstream ss;
  ss << in.rdbuf();
  std::string all = ss.str();
  uint64_t n = 0;
  std::memcpy(&n, all.data(), 8);
  nlohmann::json header = nlohmann::json::parse(all.substr(8, n));
  const char* base = all.data() + 8 + n;
  std::map<std::string, at::Tensor> out;
  for (auto& [name, info] : header.items()) {
    if (name == "__metadata__") continue;
    at::ScalarType type = at::kFloat;
    bool found = false;
    for (const auto& [t, s] : dtype_names())
      if (s == info["dtype"].get<std::string>()) type = t, found = true;
    if (!found) throw std::runtime_error("load_tensors: unsupported dtype in " + name);
    std::vector<int64_t> shape = info["shape"].get<std::vector<int64_t>>();
    size_t begin = info["data_offsets"][0].get<size_t>();
    at::Tensor t = at::empty(shape, at::TensorOptions().dtype(type));
    std::memcpy(t.data_ptr(), base + begin, static_cast<size_t>(t.numel()) * t.element_size());
    out[name] = t;
  }
  return out;
}

}  // namespace rpg::test
