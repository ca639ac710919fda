#include "rpg/model/checkpoint_files.h"

#include <ATen/ATen.h>

#include <nlohmann/json.hpp>
#include <set>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/text.h"

namespace rpg::model {
namespace st = safetensors;
namespace fs = std::filesystem;

CheckpointFiles::CheckpointFiles(const fs::path& dir) : dir_(dir), index_(dir / "model.safetensors.index.json") {
  std::vector<std::string> names;
  if (fs::exists(index_)) {
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(read_file(index_, kSmallJsonBudget, "model.safetensors.index.json"));
    } catch (const nlohmann::json::exception& e) {
      throw FormatError(str(index_.string(), ": not valid JSON: ", short_json_error(e.what())));
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw FormatError(str(index_.string(), ": missing the weight_map object"));
    std::set<std::string> files;
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it.value().is_string()) throw FormatError(str(index_.string(), ": weight_map['", it.key(), "'] is not a file name"));
      std::string f = it.value().get<std::string>();
      if (f.empty() || f.find('/') != std::string::npos || f == "." || f == "..")
        throw FormatError(str(index_.string(), ": weight_map['", it.key(), "'] = '", f, "' is not a file in the directory"));
      weight_map_[it.key()] = f;
      files.insert(f);
    }
    names.assign(files.begin(), files.end());
  } else if (fs::exists(dir / "model.safetensors")) {
    names.push_back("model.safetensors");
  } else {
    throw IoError(str(dir.string(), ": no model.safetensors or model.safetensors.index.json"));
  }
  files_.resize(names.size());
  for (size_t i = 0; i < names.size(); ++i) {
    const fs::path p = dir / names[i];
    files_[i].map = std::make_unique<st::MappedFile>(p);
    files_[i].header = st::parse(files_[i].map->data(), files_[i].map->size(), p.string());
  }
  for (size_t i = 0; i < names.size(); ++i) {
    for (const auto& t : files_[i].header.tensors) {
      const std::string where = (dir / names[i]).string();
      if (!weight_map_.empty()) {
        auto w = weight_map_.find(t.name);
        if (w == weight_map_.end() || w->second != names[i])
          throw FormatError(str(where, ": tensor '", t.name, "' is not listed for this file in ", index_.string()));
      }
      if (auto seen = tensors_.find(t.name); seen != tensors_.end())
        throw FormatError(str(where, ": tensor '", t.name, "' also appears in ", seen->second.file->path()));
      tensors_[t.name] = Entry{files_[i].map.get(), files_[i].header.data_start, &t};
    }
  }
  for (const auto& [name, file] : weight_map_)
    if (!tensors_.count(name))
      throw FormatError(str((dir / file).string(), ": tensor '", name, "' listed in the index is missing"));
}

std::string CheckpointFiles::file_of(const std::string& name) const {
  if (auto it = tensors_.find(name); it != tensors_.end()) return it->second.file->path();
  if (auto it = weight_map_.find(name); it != weight_map_.end()) return (dir_ / it->second).string();
  return sharded() ? index_.string() : (dir_ / "model.safetensors").string();
}

at::Tensor CheckpointFiles::view(const std::string& name) {
  if (last_map_) last_map_->drop(last_offset_, last_length_);
  last_map_ = nullptr;
  auto it = tensors_.find(name);
  if (it == tensors_.end()) throw FormatError(str(file_of(name), ": tensor '", name, "' is missing"));
  const Entry& e = it->second;
  at::ScalarType dtype;
  switch (e.info->dtype) {
    case st::DType::kF32: dtype = at::kFloat; break;
    case st::DType::kBF16: dtype = at::kBFloat16; break;
    case st::DType::kF16: dtype = at::kHalf; break;
    default: throw FormatError(str(e.file->path(), ": tensor '", name, "' has dtype ", st::dtype_name(e.info->dtype)));
  }
  const uint64_t offset = e.data_start + e.info->begin;
  last_map_ = e.file, last_offset_ = offset, last_length_ = e.info->end - e.info->begin;
  return at::from_blob(const_cast<uint8_t*>(e.file->data() + offset), e.info->shape, at::TensorOptions().dtype(dtype));
}

}  // namespace rpg::model
