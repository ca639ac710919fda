// A Hugging Face model directory's weight files, memory-mapped: model.safetensors, or the
// shards that model.safetensors.index.json lists. Opening checks the index (a weight_map
// object of file names inside the directory, every listed tensor present in its file and no
// tensor in two files) and every file's header; tensors are then found by name without
// reading their bytes. CausalLM::from_pretrained loads through it, and the trainer reads the
// fp32 master weights of dist.shard_master_weights from it.
#pragma once

#include <ATen/core/Tensor.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "rpg/model/safetensors.h"

namespace rpg::model {

class CheckpointFiles {
 public:
  // FormatError naming the file for a malformed index or header; IoError when the
  // directory has neither model.safetensors nor an index.
  explicit CheckpointFiles(const std::filesystem::path& dir);
  CheckpointFiles(const CheckpointFiles&) = delete;
  CheckpointFiles& operator=(const CheckpointFiles&) = delete;

  // A tensor in the files: the mapping that holds it and its header entry.
  struct Entry {
    const safetensors::MappedFile* file = nullptr;
    uint64_t data_start = 0;  // the file's data section (offsets count from it)
    const safetensors::TensorInfo* info = nullptr;
  };
  const std::map<std::string, Entry>& tensors() const { return tensors_; }
  // The file a tensor is (or, from the index, should be) in, for error messages.
  std::string file_of(const std::string& name) const;
  const std::filesystem::path& index_path() const { return index_; }
  bool sharded() const { return !weight_map_.empty(); }

  // The tensor's bytes as a tensor of its dtype (F32 / BF16 / F16), no copy: valid while this
  // object lives. Pages are read on first touch; the previous view()'s pages are dropped when
  // the next is taken (it must have been copied by then), so reading every tensor once adds
  // at most one tensor to the resident set. FormatError for a missing tensor or another dtype.
  at::Tensor view(const std::string& name);

 private:
  std::filesystem::path dir_, index_;
  std::map<std::string, std::string> weight_map_;  // tensor -> file (sharded only)
  struct Open {
    std::unique_ptr<safetensors::MappedFile> map;
    safetensors::Header header;
  };
  std::vector<Open> files_;
  std::map<std::string, Entry> tensors_;
  const safetensors::MappedFile* last_map_ = nullptr;
  uint64_t last_offset_ = 0, last_length_ = 0;
};

}  // namespace rpg::model
