// The collective parts of checkpoints and preemption (dp.h): per-rank optimizer
// shards, their manifest, agreement on success, and on a stop signal.
#include <ATen/ATen.h>

#include <algorithm>
#include <exception>
#include <nlohmann/json.hpp>

#include "rpg/core/error.h"
#include "rpg/dist/data_parallel.h"
#include "rpg/dist/world.h"
#include "rpg/train/checkpoint.h"
#include "rpg/train/dp.h"

namespace rpg::train::dp {
namespace {

std::vector<int64_t> bytes_of(const std::string& s) { return {s.begin(), s.end()}; }
std::string string_of(const std::vector<int64_t>& v) { return {v.begin(), v.end()}; }

// Every rank's string, in rank order.
std::vector<std::string> all_gather_strings(dist::ProcessGroup& pg, const std::string& mine) {
  std::vector<std::string> out;
  for (const auto& v : dist::all_gather_sequences(pg, {bytes_of(mine)})) out.push_back(string_of(v));
  return out;
}

// "<param>.<slot>" -> (param, slot): slots and global scalars have no dot.
std::pair<std::string, std::string> split_key(const std::string& key) {
  const size_t dot = key.rfind('.');
  if (dot == std::string::npos) return {"", key};
  return {key.substr(0, dot), key.substr(dot + 1)};
}

struct ParamIndex {
  std::map<std::string, size_t> index;
  std::vector<int64_t> offsets, numels;
  int64_t total = 0;
  explicit ParamIndex(const NamedTensors& params) {
    for (const auto& [name, p] : params) {
      index[name] = offsets.size();
      offsets.push_back(total);
      numels.push_back(p.numel());
      total += p.numel();
    }
  }
};

std::string shard_file(int rank, int world) { return str("optim_shard_", rank, "_of_", world, ".safetensors"); }

}  // namespace

bool shards_checkpoints() { return dist::world() != nullptr; }

void all_or_none(const std::string& what, const std::function<void()>& body) {
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return body();
  std::exception_ptr failure;
  std::string message;
  try {
    body();
  } catch (const std::exception& e) {
    failure = std::current_exception();
    message = e.what();
    if (message.empty()) message = "failed";
  }
  const auto all = all_gather_strings(*pg, message);
  if (failure) std::rethrow_exception(failure);
  for (size_t r = 0; r < all.size(); ++r)
    if (!all[r].empty()) throw Error(str(what, ": rank ", r, " failed: ", all[r]));
}

std::filesystem::path main_path(const std::filesystem::path& path) {
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return path;
  return all_gather_strings(*pg, pg->rank() == 0 ? path.string() : std::string()).at(0);
}

bool main_decides(bool value) {
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return value;
  at::Tensor t = at::full({1}, value ? 1 : 0, at::TensorOptions().dtype(at::kInt));
  pg->broadcast(t, 0);
  return t.item<int>() != 0;
}

void barrier() {
  if (dist::ProcessGroup* pg = dist::world()) pg->barrier();
}

nlohmann::json write_optimizer_shard(const Optimizer& optimizer, const std::filesystem::path& dir) {
  dist::ProcessGroup* pg = dist::world();
  const int rank = pg ? pg->rank() : 0, world = pg ? pg->size() : 1;
  const ParamIndex ix(optimizer.params());
  // A replicated optimizer (ZeRO-0) writes the slice a sharded one would hold.
  FlatRange r = flat_range(optimizer);
  if (r.begin == 0 && r.end == r.total && world > 1) r = {r.total * rank / world, r.total * (rank + 1) / world, r.total};
  const OptimizerState st = local_state(optimizer);
  std::map<std::string, at::Tensor> tensors;
  nlohmann::json scalars = nlohmann::json::object();
  auto overlap = [&](size_t i) {
    return std::make_pair(std::max(r.begin, ix.offsets[i]), std::min(r.end, ix.offsets[i] + ix.numels[i]));
  };
  for (const auto& [key, t] : st.tensors) {
    const auto [param, slot] = split_key(key);
    auto it = ix.index.find(param);
    if (it == ix.index.end()) throw Error(str("optimizer shard: state tensor '", key, "' names no parameter"));
    const auto [a, b] = overlap(it->second);
    if (a >= b) continue;
    const at::Tensor flat = t.reshape({-1});
    if (flat.numel() == b - a) tensors[key] = flat.contiguous();  // already this rank's piece
    else if (flat.numel() == ix.numels[it->second]) tensors[key] = flat.narrow(0, a - ix.offsets[it->second], b - a).contiguous();
    else throw Error(str("optimizer shard: state tensor '", key, "' has ", flat.numel(), " elements"));
  }
  for (const auto& [key, v] : st.scalars) {
    const auto [param, slot] = split_key(key);
    auto it = ix.index.find(param);
    if (it == ix.index.end()) {
      scalars[key] = v;  // a global scalar (the same on every rank)
      continue;
    }
    const auto [a, b] = overlap(it->second);
    if (a < b) scalars[key] = v;
  }
  const std::string file = shard_file(rank, world);
  save_tensor_file(dir / file, tensors);
  return {{"rank", rank},   {"file", file}, {"begin", r.begin}, {"end", r.end},
          {"bytes", static_cast<int64_t>(std::filesystem::file_size(dir / file))}, {"scalars", scalars}};
}

nlohmann::json gather_shard_manifest(const nlohmann::json& mine, const Optimizer& optimizer) {
  dist::ProcessGroup* pg = dist::world();
  nlohmann::json shards = nlohmann::json::array();
  if (!pg) shards.push_back(mine);
  else
    for (const std::string& s : all_gather_strings(*pg, mine.dump())) shards.push_back(nlohmann::json::parse(s));
  return {{"world_size", shards.size()}, {"elements", flat_range(optimizer).total}, {"shards", shards}};
}

OptimizerState read_optimizer_shards(const std::filesystem::path& dir, const nlohmann::json& manifest,
                                     const Optimizer& optimizer) {
  const std::string where = (dir / "train_state.json").string();
  const ParamIndex ix(optimizer.params());
  OptimizerState out;
  try {
    if (manifest.at("elements").get<int64_t>() != ix.total)
      throw FormatError(str(where, ": optimizer_shards cover ", manifest.at("elements").get<int64_t>(),
                            " parameter elements, the model has ", ix.total));
    std::vector<nlohmann::json> shards(manifest.at("shards").begin(), manifest.at("shards").end());
    std::sort(shards.begin(), shards.end(),
              [](const auto& a, const auto& b) { return a.at("begin").template get<int64_t>() < b.at("begin").template get<int64_t>(); });
    int64_t covered = 0;
    for (const auto& s : shards) {
      if (s.at("begin").get<int64_t>() != covered)
        throw FormatError(str(where, ": optimizer_shards leave a gap or overlap at element ", covered));
      covered = s.at("end").get<int64_t>();
    }
    if (covered != ix.total) throw FormatError(str(where, ": optimizer_shards end at element ", covered, ", not ", ix.total));
    const FlatRange want = flat_range(optimizer);
    for (const auto& s : shards) {
      const int64_t begin = s.at("begin").get<int64_t>(), end = s.at("end").get<int64_t>();
      const std::filesystem::path file = dir / s.at("file").get<std::string>();
      // Every rank checks every shard's presence and size, so all take the same decision.
      std::error_code ec;
      const auto size = std::filesystem::file_size(file, ec);
      if (ec || static_cast<int64_t>(size) != s.at("bytes").get<int64_t>())
        throw FormatError(str(file.string(), ": optimizer shard missing or of the wrong size (manifest says ",
                              s.at("bytes").get<int64_t>(), " bytes)"));
      if (end <= want.begin || begin >= want.end) continue;
      for (const auto& [key, t] : load_tensor_file(file)) {
        const auto [param, slot] = split_key(key);
        auto it = ix.index.find(param);
        if (it == ix.index.end()) throw FormatError(str(file.string(), ": '", key, "' names no parameter of the model"));
        const size_t i = it->second;
        const int64_t a = std::max(begin, ix.offsets[i]), b = std::min(end, ix.offsets[i] + ix.numels[i]);
        if (t.numel() != b - a)
          throw FormatError(str(file.string(), ": '", key, "' has ", t.numel(), " elements, its range ", b - a));
        at::Tensor& full = out.tensors[key];
        if (!full.defined()) full = at::zeros(optimizer.params()[i].second.sizes(), at::TensorOptions().dtype(t.scalar_type()));
        full.view({-1}).narrow(0, a - ix.offsets[i], b - a).copy_(t.reshape({-1}));
      }
      for (const auto& [key, v] : s.at("scalars").items()) out.scalars.emplace(key, v.get<double>());
    }
  } catch (const nlohmann::json::exception& e) {
    throw FormatError(str(where, ": malformed optimizer_shards: ", e.what()));
  }
  return out;
}

bool agree_stop(bool mine, std::string* who) {
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return mine;
  const auto all = dist::all_gather_values(*pg, {mine ? 1.0 : 0.0});
  std::vector<size_t> stopping;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r] != 0) stopping.push_back(r);
  if (stopping.empty()) return false;
  if (who) {
    *who = stopping.size() == 1 ? "rank " : "ranks ";
    for (size_t k = 0; k < stopping.size(); ++k) *who += str(k ? ", " : "", stopping[k]);
  }
  return true;
}

}  // namespace rpg::train::dp
