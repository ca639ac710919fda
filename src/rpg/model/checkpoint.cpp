// Hugging Face checkpoint I/O for CausalLM: config.json + model.safetensors or shards
// listed in model.safetensors.index.json, in F32 / BF16 / F16.
//
// Loading never holds the weights twice: files are memory-mapped (page cache, not process
// memory), each tensor is viewed in place with at::from_blob and converted once into its
// preallocated parameter, 16 MB of rows at a time, each slice's pages dropped with madvise
// right after. Peak memory is the parameters plus ~16 MB of mapped pages.
#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/model/checkpoint_files.h"
#include "rpg/model/impl.h"
#include "rpg/model/safetensors.h"
#include "rpg/model/tensor_file.h"

namespace rpg::model {
namespace st = safetensors;
namespace fs = std::filesystem;
namespace {

bool is_weight_dtype(st::DType d) { return d == st::DType::kF32 || d == st::DType::kBF16 || d == st::DType::kF16; }

std::string hf_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kBFloat16: return "bfloat16";
    case at::kHalf: return "float16";
    default: return "float32";
  }
}

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

constexpr uint64_t kSliceBytes = uint64_t{16} << 20;

}  // namespace

namespace {

// Whether every element is finite, without a full-size temporary (loading holds the weights
// once; tests/model/checkpoint_errors_test.cpp measures it): the sum is finite unless an
// element is NaN or Inf or the sum overflows, and only then are the elements checked, in
// small pieces.
bool all_finite(const at::Tensor& t) {
  if (std::isfinite(t.sum().item<double>())) return true;
  const at::Tensor flat = t.reshape({-1});
  constexpr int64_t kPiece = 1 << 16;
  for (int64_t i = 0; i < flat.numel(); i += kPiece)
    if (!at::isfinite(flat.narrow(0, i, std::min(kPiece, flat.numel() - i))).all().item<bool>()) return false;
  return true;
}

}  // namespace

CausalLM CausalLM::from_pretrained(const fs::path& dir, const LoadOptions& options) {
  ModelConfig config = ModelConfig::from_dir(dir);

  CheckpointFiles files(dir);  // the index checked, every header parsed
  const auto& tensors = files.tensors();

  // Every decoder layer has tensors of its own: a config asking for more layers than the
  // files hold tensors is refused before its parameter list (or model) is built.
  if (config.num_hidden_layers > static_cast<int64_t>(tensors.size()))
    throw FormatError(str((dir / "config.json").string(), ": num_hidden_layers is ", config.num_hidden_layers,
                          ", but the checkpoint holds only ", tensors.size(), " tensors"));
  auto shapes = config.parameter_shapes();
  // Every parameter must be present with the shape the config implies, in a float dtype.
  for (const auto& [name, shape] : shapes) {
    auto it = tensors.find(name);
    if (it == tensors.end())
      throw FormatError(str(files.file_of(name), ": tensor '", name, "' is missing (required by config.json for ",
                            config.model_type, ")"));
    const st::TensorInfo& t = *it->second.info;
    if (t.shape != shape)
      throw FormatError(str(it->second.file->path(), ": tensor '", name, "' has shape ", shape_str(t.shape),
                            ", expected ", shape_str(shape), " from config.json"));
    if (!is_weight_dtype(t.dtype))
      throw FormatError(str(it->second.file->path(), ": tensor '", name, "' has dtype ", st::dtype_name(t.dtype),
                            ", expected F32, BF16 or F16"));
  }
  std::set<std::string> expected;
  for (const auto& s : shapes) expected.insert(s.first);
  for (const auto& [name, loc] : tensors) {
    if (expected.count(name)) continue;
    // Tolerated extras: a tied lm_head some exporters still write, and RoPE tables that
    // old Llama exports stored although they are recomputed.
    if (name == "lm_head.weight" && config.tie_word_embeddings) continue;
    if (name.ends_with("rotary_emb.inv_freq")) continue;
    throw FormatError(str(loc.file->path(), ": unexpected tensor '", name, "' for ", config.model_type,
                          " (", config.num_hidden_layers, " layers)"));
  }

  at::ScalarType dtype = options.dtype ? *options.dtype : *torch_dtype(tensors.at(shapes[0].first).info->dtype);
  auto impl = std::make_unique<Impl>(std::move(config), dtype, options.device);
  auto ptrs = impl->slots();
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < ptrs.size(); ++i) {
    const CheckpointFiles::Entry& loc = tensors.at(shapes[i].first);
    const st::TensorInfo& t = *loc.info;
    at::ScalarType src_type = *torch_dtype(t.dtype);
    const uint64_t item = st::dtype_size(t.dtype);
    // Copy in slices of rows of at most kSliceBytes, dropping each slice's pages right
    // after: the mapped pages resident at any time stay bounded even for a 1 GB embedding.
    const int64_t rows = t.shape.empty() ? 1 : t.shape[0];
    const uint64_t row_bytes = rows > 0 ? (t.end - t.begin) / static_cast<uint64_t>(rows) : 0;
    const int64_t step = row_bytes > 0 ? std::max<int64_t>(1, static_cast<int64_t>(kSliceBytes / row_bytes)) : 1;
    for (int64_t r = 0; r < rows; r += step) {
      const int64_t n = std::min(step, rows - r);
      std::vector<int64_t> shape = t.shape.empty() ? std::vector<int64_t>{} : t.shape;
      if (!shape.empty()) shape[0] = n;
      uint64_t offset = loc.data_start + t.begin + static_cast<uint64_t>(r) * row_bytes;
      uint64_t bytes = t.shape.empty() ? t.end - t.begin : static_cast<uint64_t>(n) * row_bytes;
      void* ptr = const_cast<uint8_t*>(loc.file->data() + offset);
      at::Tensor src;
      if (reinterpret_cast<uintptr_t>(ptr) % item == 0) {
        src = at::from_blob(ptr, shape, at::TensorOptions().dtype(src_type));
      } else {
        // An exporter without header padding: bounce through aligned memory (one slice).
        src = at::empty(shape, at::TensorOptions().dtype(src_type));
        std::memcpy(src.data_ptr(), ptr, bytes);
      }
      // A NaN or Inf weight makes every output NaN: refused here, naming the tensor, instead
      // of generating "!!!!" or skipping every training step.
      if (!all_finite(src))
        throw FormatError(str(loc.file->path(), ": tensor '", shapes[i].first, "' holds NaN or Inf values",
                              t.shape.empty() ? std::string() : str(" (in rows ", r, "..", r + n - 1, ")")));
      if (t.shape.empty()) ptrs[i]->copy_(src);
      else ptrs[i]->narrow(0, r, n).copy_(src);
      loc.file->drop(offset, bytes);
    }
  }
  return CausalLM(std::move(impl));
}

void CausalLM::save_pretrained(const fs::path& dir, const SaveOptions& options) const {
  at::ScalarType dtype = options.dtype ? *options.dtype : impl_->dtype;
  if (dtype != at::kFloat && dtype != at::kBFloat16 && dtype != at::kHalf)
    throw ValueError(str("cannot save dtype ", c10::toString(dtype), ": expected Float, BFloat16 or Half"));
  const st::DType fdt = *file_dtype(dtype);
  if (options.max_shard_bytes < 1)
    throw ValueError(str("save_pretrained max_shard_bytes: got ", options.max_shard_bytes, ", expected >= 1"));
  auto named = named_parameters();

  // Greedy sharding in checkpoint order, as transformers does: a new shard starts when the
  // next tensor would push the current one over the limit (a lone oversized tensor gets
  // its own shard).
  struct Shard {
    std::vector<st::TensorInfo> infos;
    std::vector<at::Tensor> tensors;
    uint64_t bytes = 0;
  };
  std::vector<Shard> shards(1);
  uint64_t total = 0;
  for (const auto& [name, p] : named) {
    st::TensorInfo info;
    info.name = name;
    info.dtype = fdt;
    info.shape = p.sizes().vec();
    uint64_t bytes = static_cast<uint64_t>(p.numel()) * st::dtype_size(fdt);
    if (!shards.back().infos.empty() && shards.back().bytes + bytes > static_cast<uint64_t>(options.max_shard_bytes))
      shards.emplace_back();
    Shard& s = shards.back();
    info.begin = s.bytes;
    info.end = s.bytes + bytes;
    s.bytes += bytes;
    total += bytes;
    s.infos.push_back(std::move(info));
    s.tensors.push_back(p);
  }

  if (!options.copy_files_from.empty() && !fs::is_directory(options.copy_files_from))
    throw IoError(str("save_pretrained: copy_files_from ", options.copy_files_from.string(), " is not a directory"));
  AtomicDir out(dir);
  const size_t n = shards.size();
  nlohmann::ordered_json weight_map = nlohmann::ordered_json::object();
  for (size_t i = 0; i < n; ++i) {
    char fname[64];
    if (n == 1) std::snprintf(fname, sizeof fname, "model.safetensors");
    else std::snprintf(fname, sizeof fname, "model-%05zu-of-%05zu.safetensors", i + 1, n);
    std::vector<std::pair<std::string, at::Tensor>> shard;
    for (size_t k = 0; k < shards[i].tensors.size(); ++k) {
      shard.emplace_back(shards[i].infos[k].name, shards[i].tensors[k]);
      weight_map[shards[i].infos[k].name] = fname;
    }
    write_tensor_file(out.path() / fname, shard, {.dtype = dtype, .metadata = {{"format", "pt"}}, .after_tensor = {}});
  }
  if (n > 1) {
    nlohmann::ordered_json idx;
    idx["metadata"] = {{"total_size", total}};
    idx["weight_map"] = weight_map;
    write_file_atomic(out.path() / "model.safetensors.index.json", idx.dump(2) + "\n");
  }
  write_file_atomic(out.path() / "config.json", impl_->config.to_json(hf_dtype_name(dtype)));
  if (!options.copy_files_from.empty()) {
    for (const auto& e : fs::directory_iterator(options.copy_files_from)) {
      std::string name = e.path().filename().string();
      if (!e.is_regular_file() || name == "config.json" || name == "model.safetensors.index.json" ||
          name.ends_with(".safetensors"))
        continue;
      std::error_code ec;
      fs::copy_file(e.path(), out.path() / name, ec);
      if (ec) throw IoError(str("cannot copy ", e.path().string(), ": ", ec.message()));
    }
  }
  out.commit();
}

namespace {
const std::vector<std::pair<at::ScalarType, st::DType>>& dtype_map() {
  static const std::vector<std::pair<at::ScalarType, st::DType>> m = {
      {at::kFloat, st::DType::kF32}, {at::kDouble, st::DType::kF64}, {at::kBFloat16, st::DType::kBF16},
      {at::kHalf, st::DType::kF16},  {at::kLong, st::DType::kI64},   {at::kInt, st::DType::kI32},
      {at::kBool, st::DType::kBool}};
  return m;
}
}  // namespace

std::optional<at::ScalarType> torch_dtype(st::DType d) {
  for (const auto& [a, s] : dtype_map())
    if (s == d) return a;
  return std::nullopt;
}

std::optional<st::DType> file_dtype(at::ScalarType t) {
  for (const auto& [a, s] : dtype_map())
    if (a == t) return s;
  return std::nullopt;
}

std::vector<std::pair<std::string, at::Tensor>> as_list(const std::map<std::string, at::Tensor>& tensors) {
  return {tensors.begin(), tensors.end()};
}

void write_tensor_file(const fs::path& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                       const TensorFileOptions& options) {
  std::vector<st::TensorInfo> infos;
  uint64_t offset = 0;
  for (const auto& [name, t] : tensors) {
    const at::ScalarType type = options.dtype ? *options.dtype : t.scalar_type();
    const auto fdt = file_dtype(type);
    if (!fdt) throw ValueError(str(path.string(), ": tensor '", name, "' has dtype ", c10::toString(type),
                                   ", which rpg does not write (F64, F32, BF16, F16, I64, I32, BOOL)"));
    st::TensorInfo info;
    info.name = name;
    info.dtype = *fdt;
    info.shape = t.sizes().vec();
    info.begin = offset;
    info.end = offset + static_cast<uint64_t>(t.numel()) * st::dtype_size(*fdt);
    offset = info.end;
    infos.push_back(std::move(info));
  }
  // core/io's writer: errors name the file and errno; fault-injection point (test_hook.h).
  OutputFile f(path);
  f.write(st::serialize_header(infos, options.metadata));
  for (size_t k = 0; k < tensors.size(); ++k) {
    const at::Tensor& t = tensors[k].second;
    at::Tensor c = t.detach().to(at::kCPU, options.dtype ? *options.dtype : t.scalar_type()).contiguous();
    f.write(std::string_view(static_cast<const char*>(c.data_ptr()), c.nbytes()));
    if (options.after_tensor) {
      f.flush();
      options.after_tensor(k + 1);
    }
  }
  f.close();
}

std::map<std::string, at::Tensor> read_tensor_file(const fs::path& path) {
  st::MappedFile file(path);
  const st::Header h = st::parse(file.data(), file.size(), path.string());
  std::map<std::string, at::Tensor> out;
  for (const auto& info : h.tensors) {
    const auto type = torch_dtype(info.dtype);
    if (!type)
      throw FormatError(str(path.string(), ": tensor '", info.name, "' has dtype ", st::dtype_name(info.dtype),
                            ", which rpg does not read (F64, F32, BF16, F16, I64, I32, BOOL)"));
    at::Tensor t = at::empty(info.shape, at::TensorOptions().dtype(*type));
    std::memcpy(t.data_ptr(), file.data() + h.data_start + info.begin, info.end - info.begin);
    out.emplace(info.name, std::move(t));
  }
  return out;
}

}  // namespace rpg::model
