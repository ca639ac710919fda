#include "rpg/dist/data_parallel.h"

#include <ATen/ATen.h>

#include <map>

namespace rpg::dist {

Shard shard(int64_t items, int world, int rank, int64_t granule) {
  if (world < 1 || rank < 0 || rank >= world) throw ValueError(str("dist: rank ", rank, " is not in a world of ", world));
  if (granule < 1 || items < 0 || items % granule != 0)
    throw ValueError(str("dist: ", items, " items are not whole units of ", granule));
  const int64_t units = items / granule, base = units / world, extra = units % world;
  const int64_t begin = rank * base + std::min<int64_t>(rank, extra);
  const int64_t count = base + (rank < extra ? 1 : 0);
  return {begin * granule, (begin + count) * granule};
}

void all_reduce_gradients(ProcessGroup& pg, const std::vector<at::Tensor>& params, int64_t bucket_bytes) {
  if (pg.size() == 1) return;
  // Buckets per dtype, in parameter order (the same on every rank).
  std::map<int, std::vector<at::Tensor>> by_dtype;
  for (const auto& p : params) {
    at::Tensor& g = const_cast<at::Tensor&>(p).mutable_grad();
    if (!g.defined()) g = at::zeros_like(p);
    by_dtype[static_cast<int>(g.scalar_type())].push_back(g);
  }
  for (auto& [dtype, grads] : by_dtype) {
    size_t i = 0;
    while (i < grads.size()) {
      std::vector<at::Tensor> bucket;
      int64_t bytes = 0;
      while (i < grads.size() && (bucket.empty() || bytes + grads[i].nbytes() <= static_cast<size_t>(bucket_bytes))) {
        bytes += static_cast<int64_t>(grads[i].nbytes());
        bucket.push_back(grads[i++]);
      }
      std::vector<at::Tensor> flat_parts;
      for (const auto& g : bucket) flat_parts.push_back(g.reshape({-1}));
      at::Tensor flat = at::cat(flat_parts);
      pg.all_reduce(flat, ReduceOp::Sum);
      int64_t offset = 0;
      for (auto& g : bucket) {
        g.copy_(flat.narrow(0, offset, g.numel()).view_as(g));
        offset += g.numel();
      }
    }
  }
}

std::vector<double> all_gather_values(ProcessGroup& pg, const std::vector<double>& mine) {
  at::Tensor count = at::tensor({static_cast<int64_t>(mine.size())}, at::kLong);
  at::Tensor counts = pg.all_gather(count);
  const int64_t most = counts.max().item<int64_t>();
  at::Tensor padded = at::zeros({std::max<int64_t>(most, 1)}, at::kDouble);
  for (size_t i = 0; i < mine.size(); ++i) padded[static_cast<int64_t>(i)] = mine[i];
  at::Tensor all = pg.all_gather(padded).view({pg.size(), -1});
  std::vector<double> out;
  for (int r = 0; r < pg.size(); ++r)
    for (int64_t i = 0; i < counts[r].item<int64_t>(); ++i) out.push_back(all[r][i].item<double>());
  return out;
}

std::vector<std::vector<int64_t>> all_gather_sequences(ProcessGroup& pg, const std::vector<std::vector<int64_t>>& mine) {
  // Lengths first (every rank's), then the tokens, both padded to the longest rank's.
  std::vector<double> lengths_mine;
  std::vector<int64_t> flat;
  for (const auto& s : mine) {
    lengths_mine.push_back(static_cast<double>(s.size()));
    flat.insert(flat.end(), s.begin(), s.end());
  }
  at::Tensor n = at::tensor({static_cast<int64_t>(mine.size()), static_cast<int64_t>(flat.size())}, at::kLong);
  at::Tensor ns = pg.all_gather(n).view({pg.size(), 2});
  const std::vector<double> lengths = all_gather_values(pg, lengths_mine);
  const int64_t most = ns.select(1, 1).max().item<int64_t>();
  at::Tensor padded = at::zeros({std::max<int64_t>(most, 1)}, at::kLong);
  if (!flat.empty()) padded.narrow(0, 0, static_cast<int64_t>(flat.size())).copy_(at::tensor(flat, at::kLong));
  at::Tensor all = pg.all_gather(padded).view({pg.size(), -1});
  std::vector<std::vector<int64_t>> out;
  size_t seq = 0;
  for (int r = 0; r < pg.size(); ++r) {
    const int64_t* data = all[r].data_ptr<int64_t>();
    int64_t pos = 0;
    for (int64_t k = 0; k < ns[r][0].item<int64_t>(); ++k, ++seq) {
      const auto len = static_cast<int64_t>(lengths[seq]);
      out.emplace_back(data + pos, data + pos + len);
      pos += len;
    }
  }
  return out;
}

}  // namespace rpg::dist
