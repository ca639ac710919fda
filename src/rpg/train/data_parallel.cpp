#include "rpg/train/data_parallel.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "rpg/core/error.h"
#include "rpg/core/log.h"
#include "rpg/dist/data_parallel.h"
#include "rpg/dist/world.h"
#include "rpg/train/config.h"

namespace rpg::train::dp {

std::vector<rollout::Response> generate(rollout::RolloutEngine& engine, const std::vector<std::vector<int64_t>>& ids,
                                        rollout::SamplingParams sp) {
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return engine.generate(ids, sp);
  const auto mine = dist::shard(static_cast<int64_t>(ids.size()), pg->size(), pg->rank());
  std::vector<std::vector<int64_t>> part(ids.begin() + mine.begin, ids.begin() + mine.end);
  sp.prompt_index_offset += static_cast<uint64_t>(mine.begin);
  std::vector<rollout::Response> local;
  if (!part.empty()) local = engine.generate(part, sp);

  // Tokens, log-probs and (prompt, sample, finish, seconds) of every rank, in rank order.
  std::vector<std::vector<int64_t>> tokens;
  std::vector<double> log_probs, meta;
  for (const auto& r : local) {
    tokens.push_back(r.token_ids);
    std::vector<int64_t> lp_len{static_cast<int64_t>(r.log_probs.size())};
    tokens.push_back(lp_len);
    log_probs.insert(log_probs.end(), r.log_probs.begin(), r.log_probs.end());
    meta.insert(meta.end(), {static_cast<double>(r.prompt_index + mine.begin), static_cast<double>(r.sample_index),
                             static_cast<double>(r.finish_reason), r.seconds});
  }
  const auto all_tokens = dist::all_gather_sequences(*pg, tokens);
  const auto all_lp = dist::all_gather_values(*pg, log_probs);
  const auto all_meta = dist::all_gather_values(*pg, meta);
  std::vector<rollout::Response> out(all_meta.size() / 4);
  size_t lp = 0;
  for (size_t i = 0; i < out.size(); ++i) {
    rollout::Response& r = out[i];
    r.token_ids = all_tokens[2 * i];
    const auto n = static_cast<size_t>(all_tokens[2 * i + 1].at(0));
    r.log_probs.assign(all_lp.begin() + static_cast<std::ptrdiff_t>(lp), all_lp.begin() + static_cast<std::ptrdiff_t>(lp + n));
    lp += n;
    r.prompt_index = static_cast<int64_t>(all_meta[4 * i]);
    r.sample_index = static_cast<int64_t>(all_meta[4 * i + 1]);
    r.finish_reason = static_cast<rollout::FinishReason>(static_cast<int>(all_meta[4 * i + 2]));
    r.seconds = all_meta[4 * i + 3];
  }
  return out;
}

std::pair<size_t, size_t> micro_batch_range(size_t count) {
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return {0, count};
  const auto mine = dist::shard(static_cast<int64_t>(count), pg->size(), pg->rank());
  return {static_cast<size_t>(mine.begin), static_cast<size_t>(mine.end)};
}

void sum_rows(at::Tensor& rows) {
  if (dist::ProcessGroup* pg = dist::world()) pg->all_reduce(rows, dist::ReduceOp::Sum);
}

std::map<std::string, size_t> metric_sizes(const std::map<std::string, std::vector<double>>& metrics) {
  std::map<std::string, size_t> out;
  for (const auto& [k, v] : metrics) out[k] = v.size();
  return out;
}

bool writes_run_dir() { return dist::is_main(); }

std::filesystem::path metrics_dir(const std::filesystem::path& root) {
  if (dist::is_main()) return root;
  return root / ("rank_" + std::to_string(dist::world()->rank()));
}

dist::PlanInput plan_input(const TrainConfig& cfg, int64_t world) {
  const auto& a = cfg.actor_rollout_ref;
  if (a.model.path.empty()) throw ConfigError("actor_rollout_ref.model.path: required (a Hugging Face model directory)");
  dist::PlanInput in;
  in.model = dist::read_model_shape(a.model.path);
  in.world = world;
  in.zero_stage = cfg.dist.zero_stage;
  in.bf16_compute = cfg.choices.compute_dtype == ComputeDtype::kBFloat16;
  const bool needs_reference = cfg.choices.kl_loss_uses_reference || cfg.algorithm.use_kl_in_reward;
  in.fixed_reference = needs_reference && !(a.actor.use_iterative_ref_model && a.actor.ref_update_freq == 1);
  in.gradient_checkpointing = a.model.enable_gradient_checkpointing;
  in.sequence = cfg.data.max_prompt_length + cfg.data.max_response_length;
  const int64_t mini_rows = a.actor.ppo_mini_batch_size * a.rollout.n;
  in.micro_batch_tokens = a.actor.use_dynamic_bsz
                              ? static_cast<double>(a.actor.ppo_max_token_len_per_gpu)
                              : static_cast<double>(a.actor.ppo_micro_batch_size_per_gpu.value_or(mini_rows) * in.sequence);
  in.rollout_sequences = cfg.data.train_batch_size * a.rollout.n;
  in.max_num_seqs = a.rollout.max_num_seqs;
  in.optimizer = a.actor.optim.optim_type;
  return in;
}

void join_world(const TrainConfig& cfg, const dist::RankLayout& layout) {
  const auto& t = cfg.trainer;
  if (layout.distributed()) {
    const std::string launched = dist::describe(layout);
    if (t.nnodes && *t.nnodes != layout.nnodes)
      throw ConfigError(str("trainer.nnodes: ", *t.nnodes, ", but ", layout.nnodes, " node(s) were launched (", launched,
                            "); set trainer.nnodes=", layout.nnodes, " or launch ", *t.nnodes, " node(s)"));
    if (t.n_gpus_per_node && *t.n_gpus_per_node != layout.local_world_size)
      throw ConfigError(str("trainer.n_gpus_per_node: ", *t.n_gpus_per_node, ", but ", layout.local_world_size,
                            " process(es) per node were launched (", launched, "); set trainer.n_gpus_per_node=",
                            layout.local_world_size, " or launch ", *t.n_gpus_per_node, " per node"));
  } else if (t.nnodes.value_or(1) * t.n_gpus_per_node.value_or(1) > 1) {
    log_info("trainer.nnodes=", t.nnodes.value_or(1), " x trainer.n_gpus_per_node=", t.n_gpus_per_node.value_or(1),
             " asks for more processes, but no launcher started them: training in one process "
             "(use rpg launch / torchrun / srun for data-parallel training)");
  }
  dist::GroupOptions options;
  options.timeout = std::chrono::seconds(cfg.actor_rollout_ref.nccl_timeout);
  dist::init_world(layout, options);
}

namespace {

// Optimizer-state layout of one parameter dtype, found by asking the optimizer itself about
// a one-element parameter named "p": its per-parameter tensor slots (with their dtypes) and
// per-parameter scalars ("p.<slot>"), and its global scalars.
struct SlotLayout {
  std::map<std::string, at::ScalarType> tensors;
  std::vector<std::string> scalars;
  std::vector<std::string> globals;
};

SlotLayout probe_slots(const OptimizerOptions& options, at::ScalarType dtype) {
  NamedTensors one;
  one.emplace_back("p", at::zeros({1}, at::TensorOptions().dtype(dtype)));
  const OptimizerState st = make_optimizer(options, std::move(one))->state();
  SlotLayout out;
  for (const auto& [k, v] : st.tensors)
    if (k.rfind("p.", 0) == 0) out.tensors[k.substr(2)] = v.scalar_type();
  for (const auto& [k, v] : st.scalars) {
    if (k.rfind("p.", 0) == 0) out.scalars.push_back(k.substr(2));
    else out.globals.push_back(k);
  }
  return out;
}

int64_t state_bytes(const OptimizerState& st) {
  int64_t n = 0;
  for (const auto& [k, t] : st.tensors) n += static_cast<int64_t>(t.nbytes());
  return n;
}

class ShardedOptimizer final : public Optimizer {
 public:
  ShardedOptimizer(dist::ProcessGroup& pg, const OptimizerOptions& o, NamedTensors params, bool shard_grads)
      : Optimizer(std::move(params)), pg_(pg), sync_on_mode_switch_(o.type != "adamw"), shard_grads_(shard_grads) {
    const int w = pg.size(), r = pg.rank();
    int64_t total = 0;
    bool first = true;
    for (const auto& [name, p] : params_) {
      if (!p.is_contiguous()) throw ValueError(str("dist.zero_stage: parameter '", name, "' is not contiguous"));
      offsets_.push_back(total);
      total += p.numel();
      dtype_ = first ? p.scalar_type() : at::promote_types(dtype_, p.scalar_type());
      first = false;
      if (!layouts_.count(p.scalar_type())) layouts_[p.scalar_type()] = probe_slots(o, p.scalar_type());
    }
    for (int k = 0; k <= w; ++k) bounds_.push_back(total * k / w);
    NamedTensors mine;
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t n = params_[i].second.numel();
      const int64_t a = std::max(bounds_[r], offsets_[i]), b = std::min(bounds_[r + 1], offsets_[i] + n);
      if (a >= b) continue;
      pieces_.push_back({i, a - offsets_[i], b - a, a});
      mine.emplace_back(params_[i].first, flat(i).narrow(0, a - offsets_[i], b - a));
    }
    inner_ = train::make_optimizer(o, std::move(mine));
  }

  void step(double lr) override {
    for (size_t k = 0; k < pieces_.size(); ++k) {
      if (shard_grads_) {  // ZeRO-2: the summed gradient piece reduce_scatter_grads() left
        inner_params(k).mutable_grad() = grad_pieces_.empty() ? at::Tensor() : grad_pieces_[k];
        continue;
      }
      const at::Tensor& g = params_[pieces_[k].param].second.grad();
      inner_params(k).mutable_grad() = g.defined() ? g.reshape({-1}).narrow(0, pieces_[k].start, pieces_[k].length) : at::Tensor();
    }
    grad_pieces_.clear();
    inner_->step(lr);
    for (size_t k = 0; k < pieces_.size(); ++k) inner_params(k).mutable_grad() = at::Tensor();
    steps_ = inner_->step_count();
    gather_params();
  }
  double lr_of_next_step(double scheduled) const override { return inner_->lr_of_next_step(scheduled); }
  void use_eval_weights() override {
    inner_->use_eval_weights();
    if (sync_on_mode_switch_) gather_params();
  }
  void use_train_weights() override {
    inner_->use_train_weights();
    if (sync_on_mode_switch_) gather_params();
  }

  OptimizerState state() const override {
    c10::NoGradGuard no_grad;
    const OptimizerState local = inner_->state();
    OptimizerState full;
    std::set<std::string> slots, globals;
    for (const auto& [dtype, l] : layouts_) {
      for (const auto& [s, unused] : l.tensors) slots.insert(s);
      globals.insert(l.globals.begin(), l.globals.end());
    }
    for (const std::string& g : globals) full.scalars[g] = local.scalars.at(g);  // the same on every rank
    // Tensor slots: one all-gather of the flat vector per slot (zeros where a parameter has none).
    const int64_t chunk = max_chunk();
    for (const std::string& slot : slots) {
      at::ScalarType wide = at::kFloat;
      for (const auto& [dtype, l] : layouts_)
        if (auto it = l.tensors.find(slot); it != l.tensors.end()) wide = at::promote_types(wide, it->second);
      at::Tensor mine = at::zeros({chunk}, at::TensorOptions().dtype(wide));
      int64_t pos = 0;
      for (const Piece& pc : pieces_) {
        auto it = local.tensors.find(params_[pc.param].first + "." + slot);
        if (it != local.tensors.end()) mine.narrow(0, pos, pc.length).copy_(it->second.reshape({-1}));
        pos += pc.length;
      }
      const at::Tensor all = unchunk(pg_.all_gather(mine));
      for (size_t i = 0; i < params_.size(); ++i) {
        const auto& [name, p] = params_[i];
        const auto& l = layouts_.at(p.scalar_type()).tensors;
        auto it = l.find(slot);
        if (it == l.end()) continue;
        full.tensors[name + "." + slot] = all.narrow(0, offsets_[i], p.numel()).reshape(p.sizes()).to(it->second).clone();
      }
    }
    // Per-parameter scalars: the owners' value (every owner of a piece holds the same), by max.
    std::set<std::string> scalars;
    for (const auto& [dtype, l] : layouts_) scalars.insert(l.scalars.begin(), l.scalars.end());
    for (const std::string& sc : scalars) {
      at::Tensor v = at::full({static_cast<int64_t>(params_.size())}, -std::numeric_limits<double>::infinity(),
                              at::TensorOptions().dtype(at::kDouble));
      for (const Piece& pc : pieces_)
        if (auto it = local.scalars.find(params_[pc.param].first + "." + sc); it != local.scalars.end())
          v[static_cast<int64_t>(pc.param)] = it->second;
      pg_.all_reduce(v, dist::ReduceOp::Max);
      for (size_t i = 0; i < params_.size(); ++i) {
        const double x = v[static_cast<int64_t>(i)].item<double>();
        if (std::isfinite(x)) full.scalars[params_[i].first + "." + sc] = x;
      }
    }
    return full;
  }

  void load_state(const OptimizerState& full) override {
    OptimizerState local;
    for (const auto& [dtype, l] : layouts_)
      for (const std::string& g : l.globals)
        if (auto it = full.scalars.find(g); it != full.scalars.end()) local.scalars[g] = it->second;
    for (const Piece& pc : pieces_) {
      const auto& [name, p] = params_[pc.param];
      const SlotLayout& l = layouts_.at(p.scalar_type());
      for (const auto& [slot, unused] : l.tensors) {
        const std::string key = name + "." + slot;
        auto it = full.tensors.find(key);
        if (it == full.tensors.end()) throw FormatError(str("optimizer state: missing tensor '", key, "'"));
        if (it->second.numel() != p.numel())
          throw FormatError(str("optimizer state: '", key, "' has shape ", it->second.sizes(), ", the parameter ", p.sizes()));
        local.tensors[key] = it->second.reshape({-1}).narrow(0, pc.start, pc.length);
      }
      for (const std::string& sc : l.scalars)
        if (auto it = full.scalars.find(name + "." + sc); it != full.scalars.end()) local.scalars[name + "." + sc] = it->second;
    }
    inner_->load_state(local);
    steps_ = inner_->step_count();
    gather_params();
  }

  int64_t local_bytes() const { return state_bytes(inner_->state()); }
  bool shards_gradients() const { return shard_grads_; }
  // This rank's range of the flattened parameters and their total.
  FlatRange range() const { return {bounds_[pg_.rank()], bounds_[pg_.rank() + 1], bounds_.back()}; }
  // The inner optimizer's state: tensors of this rank's pieces (flat), their scalars, the globals.
  OptimizerState local_state() const { return inner_->state(); }

  // ZeRO-2: every rank's full gradients (accumulated over its micro-batches) are summed by a
  // reduce-scatter, in buckets of at most `bucket_bytes` per rank: this rank keeps only the
  // sum over its 1/N of the flattened parameters; the full gradients are dropped. Bucket j
  // takes positions [j, j + len) of every rank's range, so each rank's output is contiguous.
  void reduce_scatter_grads(int64_t bucket_bytes) {
    c10::NoGradGuard no_grad;
    const int w = pg_.size(), me = pg_.rank();
    const int64_t chunk = max_chunk();
    const int64_t bucket = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(c10::elementSize(dtype_)));
    grad_pieces_.clear();
    for (const Piece& pc : pieces_) grad_pieces_.push_back(at::zeros({pc.length}, at::TensorOptions().dtype(dtype_)));
    for (int64_t j = 0; j < chunk; j += bucket) {
      const int64_t len = std::min(bucket, chunk - j);
      at::Tensor in = at::zeros({w * len}, at::TensorOptions().dtype(dtype_));
      for (int r = 0; r < w; ++r) {
        const int64_t a = bounds_[r] + j, b = std::min(bounds_[r] + j + len, bounds_[r + 1]);
        if (a < b) copy_flat_grads(a, b, in.narrow(0, static_cast<int64_t>(r) * len, b - a));
      }
      const at::Tensor out = pg_.reduce_scatter(in);
      // out[x] is flat position bounds_[me] + j + x of the summed gradient.
      const int64_t a = bounds_[me] + j, b = std::min(a + len, bounds_[me + 1]);
      for (size_t k = 0; k < pieces_.size(); ++k) {
        const int64_t pa = std::max(a, pieces_[k].flat_begin), pb = std::min(b, pieces_[k].flat_begin + pieces_[k].length);
        if (pa < pb) grad_pieces_[k].narrow(0, pa - pieces_[k].flat_begin, pb - pa).copy_(out.narrow(0, pa - a, pb - pa));
      }
    }
    for (auto& [name, p] : params_) p.mutable_grad() = at::Tensor();
  }

  // ZeRO-2: clip_grad_norm on the global norm of the sharded gradient (each rank's squared
  // norm, summed over the ranks in double).
  double clip_sharded_grads(double max_norm) {
    c10::NoGradGuard no_grad;
    at::Tensor sq = at::zeros({1}, at::TensorOptions().dtype(at::kDouble));
    for (const at::Tensor& g : grad_pieces_) sq += at::linalg_vector_norm(g, 2).to(at::kDouble).pow(2);
    pg_.all_reduce(sq, dist::ReduceOp::Sum);
    const double total = std::sqrt(sq.item<double>());
    if (!std::isfinite(total)) {
      grad_pieces_.clear();  // the step is skipped
      return total;
    }
    const double coef = std::min(1.0, max_norm / (total + 1e-6));
    for (at::Tensor& g : grad_pieces_) g.mul_(coef);
    return total;
  }

 private:
  struct Piece {
    size_t param;
    int64_t start, length;  // within the flattened parameter
    int64_t flat_begin;     // within all parameters flattened
  };

  // Positions [a, b) of the flattened gradients (zeros for a parameter without one) into `dst`.
  void copy_flat_grads(int64_t a, int64_t b, at::Tensor dst) const {
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t n = params_[i].second.numel();
      const int64_t pa = std::max(a, offsets_[i]), pb = std::min(b, offsets_[i] + n);
      if (pa >= pb) continue;
      const at::Tensor& g = params_[i].second.grad();
      if (g.defined()) dst.narrow(0, pa - a, pb - pa).copy_(g.reshape({-1}).narrow(0, pa - offsets_[i], pb - pa));
    }
  }

  at::Tensor flat(size_t i) const { return params_[i].second.detach().view({-1}); }
  const at::Tensor& inner_params(size_t k) const { return inner_->params()[k].second; }
  int64_t max_chunk() const {
    int64_t m = 0;
    for (size_t k = 0; k + 1 < bounds_.size(); ++k) m = std::max(m, bounds_[k + 1] - bounds_[k]);
    return m;
  }
  // all_gather's [world * chunk] (each rank's chunk padded) -> the flat [total] vector.
  at::Tensor unchunk(const at::Tensor& all) const {
    const int64_t chunk = max_chunk();
    std::vector<at::Tensor> parts;
    for (size_t k = 0; k + 1 < bounds_.size(); ++k)
      parts.push_back(all.narrow(0, static_cast<int64_t>(k) * chunk, bounds_[k + 1] - bounds_[k]));
    return at::cat(parts);
  }
  // Every rank's updated piece to every rank: the parameters' bytes, all-gathered exactly.
  void gather_params() {
    c10::NoGradGuard no_grad;
    at::Tensor mine = at::zeros({max_chunk()}, at::TensorOptions().dtype(dtype_));
    int64_t pos = 0;
    for (const Piece& pc : pieces_) {
      mine.narrow(0, pos, pc.length).copy_(flat(pc.param).narrow(0, pc.start, pc.length));
      pos += pc.length;
    }
    const at::Tensor bytes = pg_.all_gather(mine.view(at::kByte));
    const at::Tensor all = unchunk(bytes.view(dtype_));
    for (size_t i = 0; i < params_.size(); ++i) flat(i).copy_(all.narrow(0, offsets_[i], params_[i].second.numel()));
  }

  dist::ProcessGroup& pg_;
  bool sync_on_mode_switch_;
  bool shard_grads_;                     // ZeRO-2
  std::vector<at::Tensor> grad_pieces_;  // ZeRO-2: this rank's summed gradient, per piece
  std::vector<int64_t> offsets_, bounds_;
  at::ScalarType dtype_ = at::kFloat;
  std::map<at::ScalarType, SlotLayout> layouts_;
  std::vector<Piece> pieces_;
  std::unique_ptr<Optimizer> inner_;
};

}  // namespace

std::unique_ptr<Optimizer> make_sharded_optimizer(dist::ProcessGroup& pg, const OptimizerOptions& options,
                                                  NamedTensors params, bool shard_gradients) {
  return std::make_unique<ShardedOptimizer>(pg, options, std::move(params), shard_gradients);
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, NamedTensors params, int64_t zero_stage) {
  dist::ProcessGroup* pg = dist::world();
  if (zero_stage >= 1 && pg) return make_sharded_optimizer(*pg, options, std::move(params), zero_stage >= 2);
  return train::make_optimizer(options, std::move(params));
}

FlatRange flat_range(const Optimizer& optimizer) {
  if (const auto* s = dynamic_cast<const ShardedOptimizer*>(&optimizer)) return s->range();
  int64_t total = 0;
  for (const auto& [name, p] : optimizer.params()) total += p.numel();
  return {0, total, total};
}

OptimizerState local_state(const Optimizer& optimizer) {
  if (const auto* s = dynamic_cast<const ShardedOptimizer*>(&optimizer)) return s->local_state();
  return optimizer.state();
}

double clip_grad_norm(Optimizer& optimizer, double max_norm) {
  if (auto* s = dynamic_cast<ShardedOptimizer*>(&optimizer); s && s->shards_gradients())
    return s->clip_sharded_grads(max_norm);
  return train::clip_grad_norm(optimizer.params(), max_norm);
}

int64_t local_state_bytes(const Optimizer& optimizer) {
  if (const auto* s = dynamic_cast<const ShardedOptimizer*>(&optimizer)) return s->local_bytes();
  return state_bytes(optimizer.state());
}


void reduce_update(Optimizer& optimizer, const std::vector<at::Tensor>& params,
                   std::map<std::string, std::vector<double>>& metrics, const std::map<std::string, size_t>& before) {
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return;
  if (auto* s = dynamic_cast<ShardedOptimizer*>(&optimizer); s && s->shards_gradients())
    s->reduce_scatter_grads(int64_t{25} << 20);  // ZeRO-2: each rank keeps its shard of the sum
  else
    dist::all_reduce_gradients(*pg, params);
  // Metric names: a rank without micro-batches has none, so they are gathered first.
  std::vector<std::vector<int64_t>> names;
  for (const auto& [k, v] : metrics) names.emplace_back(k.begin(), k.end());
  std::map<std::string, bool> all_names;
  for (const auto& n : dist::all_gather_sequences(*pg, names)) all_names[std::string(n.begin(), n.end())] = true;
  for (const auto& [name, unused] : all_names) {
    std::vector<double>& values = metrics[name];
    auto it = before.find(name);
    const size_t keep = it == before.end() ? 0 : it->second;
    std::vector<double> mine(values.begin() + static_cast<std::ptrdiff_t>(keep), values.end());
    values.resize(keep);
    for (double v : dist::all_gather_values(*pg, mine)) values.push_back(v);
  }
}

}  // namespace rpg::train::dp
