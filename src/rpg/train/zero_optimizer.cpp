#include "rpg/train/zero_optimizer.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <torch/csrc/autograd/function_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>

#include "rpg/core/error.h"
#include "rpg/dist/data_parallel.h"
#include "rpg/dist/memory.h"
#include "rpg/dist/process_group.h"
#include "rpg/dist/world.h"

namespace rpg::train::dp {

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

// Optimizer slots that start as a copy of the (master) weights: the fp32 master, and
// schedule-free AdamW's base sequence z (z_0 = x_0 = y_0).
constexpr const char* kStartsAtTheWeights[] = {".master", ".z"};

bool is_master_key(const std::string& k) { return k.size() > 7 && k.compare(k.size() - 7, 7, ".master") == 0; }

// `st` (an optimizer's state() with its kStartsAtTheWeights slots overwritten in place) applied to
// `o`: when state() handed out the optimizer's own tensors (AdamW and schedule-free AdamW
// do) the masters are in place already and only the parameters take their bf16 rounding,
// with no second copy of the state; otherwise load_state().
void apply_masters(Optimizer& o, const OptimizerState& st) {
  c10::NoGradGuard no_grad;
  const OptimizerState again = o.state();
  for (const auto& [k, t] : st.tensors) {
    const bool written = std::any_of(std::begin(kStartsAtTheWeights), std::end(kStartsAtTheWeights), [&](const char* s) {
      const size_t n = std::strlen(s);
      return k.size() > n && k.compare(k.size() - n, n, s) == 0;
    });
    if (!written) continue;
    auto it = again.tensors.find(k);
    if (it == again.tensors.end() || !it->second.is_same(t)) return o.load_state(st);
  }
  for (const auto& [name, p] : o.params())
    if (auto it = st.tensors.find(name + ".master"); it != st.tensors.end()) p.detach().copy_(it->second.view(p.sizes()));
}

int64_t state_bytes(const OptimizerState& st) {
  int64_t n = 0;
  for (const auto& [k, t] : st.tensors) n += static_cast<int64_t>(t.nbytes());
  return n;
}

class ShardedOptimizer final : public Optimizer {
 public:
  ShardedOptimizer(dist::ProcessGroup& pg, const OptimizerOptions& o, NamedTensors params, bool shard_grads,
                   int64_t bucket_bytes)
      : Optimizer(std::move(params)), pg_(pg), sync_on_mode_switch_(o.type != "adamw"), shard_grads_(shard_grads) {
    const int w = pg.size(), r = pg.rank();
    int64_t total = 0;
    bool first = true;
    for (const auto& [name, p] : params_) {
      if (!p.is_contiguous()) throw ValueError(str("dist.zero_stage: parameter '", name, "' is not contiguous"));
      offsets_.push_back(total);
      total += p.numel();
      dtype_ = first ? p.scalar_type() : at::promote_types(dtype_, p.scalar_type());
      if (first) device_ = p.device();
      first = false;
      if (!layouts_.count(p.scalar_type())) layouts_[p.scalar_type()] = probe_slots(o, p.scalar_type());
    }
    // Gradients are reduced and accumulated in at least fp32 (bf16 parameters under
    // dist.shard_master_weights: the buckets and the shard are fp32, as the masters they update).
    grad_dtype_ = at::promote_types(dtype_, at::kFloat);
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
    gather_bytes_ = bucket_bytes;
    if (shard_grads_) {
      grad_shard_ = at::zeros({bounds_[r + 1] - bounds_[r]}, at::TensorOptions().dtype(grad_dtype_).device(device_));
      dist::memory::add(dist::memory::Kind::Gradients, static_cast<int64_t>(grad_shard_.nbytes()));
      make_buckets(bucket_bytes);
      std::vector<at::Tensor> sources;
      for (const auto& [name, p] : params_) sources.push_back(p);
      attach_gradient_sources(sources);
    }
  }
  ~ShardedOptimizer() override {
    detach_hooks();
    if (grad_shard_.defined()) dist::memory::add(dist::memory::Kind::Gradients, -static_cast<int64_t>(grad_shard_.nbytes()));
  }

  void step(double lr) override {
    for (size_t k = 0; k < pieces_.size(); ++k) {
      if (shard_grads_) {  // ZeRO-2: the summed gradient piece finish_gradients() left
        inner_params(k).mutable_grad() = grad_pieces_.empty() ? at::Tensor() : grad_pieces_[k];
        continue;
      }
      const at::Tensor& g = params_[pieces_[k].param].second.grad();
      inner_params(k).mutable_grad() = g.defined() ? g.reshape({-1}).narrow(0, pieces_[k].start, pieces_[k].length) : at::Tensor();
    }
    grad_pieces_.clear();
    inner_->step(lr);
    for (size_t k = 0; k < pieces_.size(); ++k) inner_params(k).mutable_grad() = at::Tensor();
    if (shard_grads_) grad_shard_.zero_();  // the next mini-batch accumulates from zero
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
  // dist.shard_master_weights: this rank's pieces of the fp32 master copies taken from the
  // full-precision weights (`master_of(name)`), instead of the bf16 parameters they were made from.
  template <class F>
  void init_master_weights(const F& master_of) {
    c10::NoGradGuard no_grad;
    OptimizerState st = inner_->state();
    for (const Piece& pc : pieces_) {
      const std::string& name = params_[pc.param].first;
      // In place: no second copy of the masters (state() hands out the optimizer's own
      // tensors; apply_masters makes it right whether or not it does).
      const at::Tensor full = master_of(name).detach().reshape({-1}).narrow(0, pc.start, pc.length);
      for (const char* slot : kStartsAtTheWeights)
        if (auto it = st.tensors.find(name + slot); it != st.tensors.end()) it->second.copy_(full);
    }
    apply_masters(*inner_, st);
  }

  // ---- ZeRO-2: gradients reduced bucket by bucket during the backward passes -----------------
  // The parameters are grouped into buckets of consecutive parameters, in reverse order (the
  // order backward produces their gradients), of at most `bucket_bytes` (a larger parameter
  // is a bucket of its own). A hook on each gradient source (the parameters, or the bf16
  // compute copy's, attach_gradient_sources) copies the gradient into its bucket's flat
  // buffer (in the optimizer's dtype) as soon as autograd has accumulated it and drops it.
  // Buckets are sent in a fixed order (every rank issues the same collectives): once bucket
  // k and all before it are complete, it is reduced to the ranks that own its positions
  // (one c10d reduce per owner: the parts of the flattened parameters in their ranges),
  // asynchronously, while backward goes on; before the next one is sent the previous one is
  // waited for and its owned part added into this rank's persistent gradient shard
  // (grad_shard_). So a rank holds at most its shard, the bucket in flight, the bucket
  // being filled and one parameter's gradient -- never the full gradient. After each
  // micro-batch's backward, end_micro_batch() sends the buckets not yet sent (a parameter
  // without a gradient counts as zeros). Gradient accumulation over micro-batches happens in
  // the shard. A rank with fewer micro-batches than another sends zero buckets for the
  // missing ones (finish_gradients()), so the collectives match.

  // The tensors whose gradients backward produces, in params() order and shapes: the
  // parameters themselves, or a lower-precision compute copy's (its gradients are converted
  // to the optimizer's dtype in the buckets).
  void attach_gradient_sources(const std::vector<at::Tensor>& sources) {
    if (!shard_grads_) return;
    if (sources.size() != params_.size()) throw ValueError("dist.zero_stage=2: gradient sources do not match the parameters");
    detach_hooks();
    for (size_t i = 0; i < sources.size(); ++i) {
      if (sources[i].sizes() != params_[i].second.sizes())
        throw ValueError(str("dist.zero_stage=2: gradient source of '", params_[i].first, "' has shape ",
                             sources[i].sizes(), ", the parameter ", params_[i].second.sizes()));
      torch::autograd::impl::set_post_acc_grad_hooks(sources[i], std::make_unique<GradHook>(this, i));
    }
    sources_ = sources;
  }

  // After one micro-batch's backward on this rank.
  void end_micro_batch() {
    if (!shard_grads_) return;
    c10::NoGradGuard no_grad;
    // Gradients still attached to the sources (none, unless a hook did not run) count too:
    // the accounting looks at what the tensors hold, not only at what the hooks did.
    int64_t attached = 0;
    for (const at::Tensor& t : sources_)
      if (t.grad().defined()) attached += static_cast<int64_t>(t.grad().nbytes());
    dist::memory::observe(dist::memory::Kind::Gradients, attached);
    while (next_bucket_ < buckets_.size()) launch(next_bucket_++);
    next_bucket_ = 0;
    std::fill(arrived_.begin(), arrived_.end(), false);
    for (Bucket& b : buckets_) b.missing = static_cast<int64_t>(b.params.size());
    ++rounds_;
  }

  // After this rank's last micro-batch of a mini-batch of `micro_batches` (shared out as
  // micro_batch_range does: the first ranks get ceil(micro_batches / N)): zero rounds up to
  // that many (known to every rank without a collective, which a rank still reducing its last
  // micro-batch would not be in), wait for the last bucket, and hand the shard to clipping
  // and step().
  void finish_gradients(int64_t micro_batches) {
    c10::NoGradGuard no_grad;
    const int64_t most = (micro_batches + pg_.size() - 1) / pg_.size();
    if (rounds_ > most)
      throw Error(str("dist.zero_stage=2: ", rounds_, " micro-batches on rank ", pg_.rank(), ", expected at most ", most));
    while (rounds_ < most) end_micro_batch();
    wait_in_flight();
    rounds_ = 0;
    if (!rebuilt_) rebuild_buckets();
    grad_pieces_.clear();
    for (const Piece& pc : pieces_) grad_pieces_.push_back(grad_shard_.narrow(0, pc.flat_begin - bounds_[pg_.rank()], pc.length));
  }

  // Bytes of the largest bucket's buffer (the accounting's bound uses it).
  int64_t bucket_capacity_bytes() const {
    int64_t most = 0;
    for (const Bucket& b : buckets_) most = std::max(most, b.size * static_cast<int64_t>(c10::elementSize(grad_dtype_)));
    return most;
  }
  int64_t shard_bytes() const { return grad_shard_.defined() ? static_cast<int64_t>(grad_shard_.nbytes()) : 0; }

  // ZeRO-2: clip_grad_norm on the global norm of the sharded gradient, formed as
  // train::clip_grad_norm forms it on one process: each parameter's norm over its whole
  // gradient in the gradients' dtype, then the norm of those norms. A norm summed from the
  // shards' pieces (as before 2026-12-02) rounds differently, and once clipping is active
  // the coefficient's ulp moved every weight by an ulp (2 ranks then drifted ~1e-5 from 1
  // process in three steps). A parameter whose gradient is split between ranks (at most
  // world - 1 of them) is gathered first: one parameter's gradient, within ZeRO-2's bound.
  double clip_sharded_grads(double max_norm) {
    c10::NoGradGuard no_grad;
    const int me = pg_.rank();
    const auto opts = at::TensorOptions().dtype(grad_dtype_).device(device_);  // the shard's
    at::Tensor norms = at::zeros({static_cast<int64_t>(params_.size())}, opts);  // each set by one rank
    std::vector<std::pair<int64_t, at::Tensor>> split;                              // the same on every rank
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t a = offsets_[i], n = params_[i].second.numel(), e = a + n;
      int holders = 0;
      for (int r = 0; r < pg_.size(); ++r) holders += std::max(a, bounds_[r]) < std::min(e, bounds_[r + 1]);
      if (holders <= 1) {
        if (a >= bounds_[me] && e <= bounds_[me + 1] && n > 0)
          norms.narrow(0, static_cast<int64_t>(i), 1).copy_(at::linalg_vector_norm(grad_shard_.narrow(0, a - bounds_[me], n), 2).reshape({1}));
        continue;
      }
      at::Tensor whole = at::zeros({n}, opts);
      const int64_t pa = std::max(a, bounds_[me]), pe = std::min(e, bounds_[me + 1]);
      if (pa < pe) whole.narrow(0, pa - a, pe - pa).copy_(grad_shard_.narrow(0, pa - bounds_[me], pe - pa));
      pg_.all_reduce(whole, dist::ReduceOp::Sum);  // the other ranks add zeros: exact
      split.emplace_back(static_cast<int64_t>(i), at::linalg_vector_norm(whole, 2));
    }
    pg_.all_reduce(norms, dist::ReduceOp::Sum);
    for (const auto& [i, v] : split) norms.narrow(0, i, 1).copy_(v.reshape({1}));
    const at::Tensor total_t = at::linalg_vector_norm(norms, 2);
    const double total = total_t.item<double>();
    if (!std::isfinite(total)) {
      grad_pieces_.clear();  // the step is skipped
      grad_shard_.zero_();
      return total;
    }
    const at::Tensor coef = ((total_t + 1e-6).reciprocal() * max_norm).clamp_max(1.0);
    for (at::Tensor& g : grad_pieces_) g.mul_(coef);
    return total;
  }

 private:
  struct Piece {
    size_t param;
    int64_t start, length;  // within the flattened parameter
    int64_t flat_begin;     // within all parameters flattened
  };

  struct GradHook final : torch::autograd::PostAccumulateGradHook {
    GradHook(ShardedOptimizer* o, size_t i) : owner(o), index(i) {}
    void operator()(const torch::autograd::Variable& tensor) override { owner->arrived(index, tensor); }
    ShardedOptimizer* owner;
    size_t index;
  };
  struct Bucket {
    std::vector<size_t> params;  // sorted by flat position: each owner's part is contiguous
    int64_t size = 0;            // elements
    int64_t missing = 0;         // parameters whose gradient has not arrived in this round
    at::Tensor buffer;           // [size]: the parameters' gradients, in `params` order
  };
  struct InFlight {
    size_t bucket = 0;
    at::Tensor buffer;
    std::vector<dist::Pending> works;
  };

  // Buckets of at most `bucket_bytes` over the parameters taken in `order` (the order their
  // gradients arrive in: reverse parameter order at first, then the order rank 0 saw).
  void make_buckets(int64_t bucket_bytes, const std::vector<size_t>& order) {
    bucket_bytes_ = bucket_bytes;
    const int64_t cap = std::max<int64_t>(1, bucket_bytes / static_cast<int64_t>(c10::elementSize(grad_dtype_)));
    buckets_.clear();
    bucket_of_.assign(params_.size(), 0);
    buffer_offset_.assign(params_.size(), 0);
    arrived_.assign(params_.size(), false);
    for (size_t j : order) {
      const int64_t n = params_[j].second.numel();
      if (buckets_.empty() || buckets_.back().size + n > cap) buckets_.emplace_back();
      buckets_.back().params.push_back(j);
      buckets_.back().size += n;
      bucket_of_[j] = buckets_.size() - 1;
    }
    for (Bucket& b : buckets_) {
      std::sort(b.params.begin(), b.params.end());
      int64_t pos = 0;
      for (size_t j : b.params) buffer_offset_[j] = pos, pos += params_[j].second.numel();
      b.missing = static_cast<int64_t>(b.params.size());
    }
  }
  void make_buckets(int64_t bucket_bytes) {
    std::vector<size_t> order;
    for (size_t j = params_.size(); j-- > 0;) order.push_back(j);
    make_buckets(bucket_bytes, order);
  }

  // After the first mini-batch (collective): the buckets follow the order in which rank 0's
  // gradients arrived (as DDP's Reducer rebuilds its buckets), so that a bucket is complete
  // as soon as backward is past it; parameters that never got a gradient go last.
  void rebuild_buckets() {
    at::Tensor order = at::full({static_cast<int64_t>(params_.size())}, -1, at::kLong);
    std::vector<bool> seen(params_.size(), false);
    int64_t k = 0;
    for (size_t j : arrival_order_)
      if (!seen[j]) seen[j] = true, order[k++] = static_cast<int64_t>(j);
    for (size_t j = params_.size(); j-- > 0;)
      if (!seen[j]) order[k++] = static_cast<int64_t>(j);
    pg_.broadcast(order, 0);
    std::vector<size_t> o;
    for (int64_t i = 0; i < order.numel(); ++i) o.push_back(static_cast<size_t>(order[i].item<int64_t>()));
    make_buckets(bucket_bytes_, o);
    rebuilt_ = true;
    arrival_order_.clear();
  }

  void detach_hooks() {
    for (const at::Tensor& t : sources_) torch::autograd::impl::set_post_acc_grad_hooks(t, nullptr);
    sources_.clear();
  }

  void alloc_buffer(Bucket& b) {
    if (b.buffer.defined()) return;
    b.buffer = at::zeros({b.size}, at::TensorOptions().dtype(grad_dtype_).device(device_));  // the gradients'/shard's
    dist::memory::add(dist::memory::Kind::Gradients, static_cast<int64_t>(b.buffer.nbytes()));
  }

  // The hook: source `i`'s gradient, accumulated by autograd for this backward pass.
  void arrived(size_t i, const at::Tensor& source) {
    c10::NoGradGuard no_grad;
    at::Tensor& g = const_cast<at::Tensor&>(source).mutable_grad();
    if (!g.defined()) return;
    const int64_t g_bytes = static_cast<int64_t>(g.nbytes());
    dist::memory::add(dist::memory::Kind::Gradients, g_bytes);
    Bucket& b = buckets_[bucket_of_[i]];
    if (arrived_[i] || bucket_of_[i] < next_bucket_)
      throw Error(str("dist.zero_stage=2: a second gradient for '", params_[i].first,
                      "' in one micro-batch (call end_micro_batch after each backward)"));
    if (b.params.size() == 1 && g.scalar_type() == grad_dtype_ && g.is_contiguous()) {
      b.buffer = g.view({-1});  // a bucket of one parameter: its gradient is the buffer (no copy)
    } else {
      alloc_buffer(b);
      b.buffer.narrow(0, buffer_offset_[i], g.numel()).copy_(g.reshape({-1}));
      dist::memory::add(dist::memory::Kind::Gradients, -g_bytes);
    }
    g = at::Tensor();
    arrived_[i] = true;
    if (!rebuilt_) arrival_order_.push_back(i);
    --b.missing;
    while (next_bucket_ < buckets_.size() && buckets_[next_bucket_].missing == 0) launch(next_bucket_++);
  }

  // Reduces bucket k to the owners of its positions (after the previous bucket is done).
  void launch(size_t k) {
    wait_in_flight();
    Bucket& b = buckets_[k];
    alloc_buffer(b);
    in_flight_.bucket = k;
    in_flight_.buffer = std::move(b.buffer);
    b.buffer = at::Tensor();
    // Rank r's part: the pieces of the bucket's parameters in its range, contiguous in the
    // buffer because the parameters are sorted by flat position.
    for (int r = 0; r < pg_.size(); ++r) {
      int64_t first = -1, last = -1;
      for (size_t j : b.params) {
        const int64_t a = std::max(offsets_[j], bounds_[r]), e = std::min(offsets_[j] + params_[j].second.numel(), bounds_[r + 1]);
        if (a >= e) continue;
        if (first < 0) first = buffer_offset_[j] + (a - offsets_[j]);
        last = buffer_offset_[j] + (e - offsets_[j]);
      }
      if (first >= 0) in_flight_.works.push_back(pg_.reduce_async(in_flight_.buffer.narrow(0, first, last - first), r));
    }
  }

  // Waits for the bucket in flight and adds this rank's part of it into the shard.
  void wait_in_flight() {
    if (!in_flight_.buffer.defined()) return;
    for (dist::Pending& w : in_flight_.works) w.wait();
    const Bucket& b = buckets_[in_flight_.bucket];
    const int me = pg_.rank();
    for (size_t j : b.params) {
      const int64_t a = std::max(offsets_[j], bounds_[me]), e = std::min(offsets_[j] + params_[j].second.numel(), bounds_[me + 1]);
      if (a < e)
        grad_shard_.narrow(0, a - bounds_[me], e - a).add_(in_flight_.buffer.narrow(0, buffer_offset_[j] + (a - offsets_[j]), e - a));
    }
    dist::memory::add(dist::memory::Kind::Gradients, -static_cast<int64_t>(in_flight_.buffer.nbytes()));
    in_flight_ = InFlight{};
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
    // In buckets of at most gather_bytes_ per rank (the parameters' bytes, exact): the
    // transient is N buckets, not a full copy of the weights.
    c10::NoGradGuard no_grad;
    const int w = pg_.size(), me = pg_.rank();
    const int64_t chunk = max_chunk();
    const int64_t len_max = std::max<int64_t>(1, gather_bytes_ / static_cast<int64_t>(c10::elementSize(dtype_)));
    for (int64_t j = 0; j < chunk; j += len_max) {
      const int64_t len = std::min(len_max, chunk - j);
      at::Tensor mine = at::zeros({len}, at::TensorOptions().dtype(dtype_));
      const int64_t a = bounds_[me] + j, b = std::min(a + len, bounds_[me + 1]);
      if (a < b) params_to_flat(a, b, mine);
      const at::Tensor all = pg_.all_gather(mine.view(at::kByte)).view(dtype_);
      for (int k = 0; k < w; ++k) {
        const int64_t ka = bounds_[k] + j, kb = std::min(ka + len, bounds_[k + 1]);
        if (ka < kb) flat_to_params(ka, kb, all.narrow(0, static_cast<int64_t>(k) * len, kb - ka));
      }
    }
  }
  // Flat positions [a, b) of the parameters into / from `t` (converting dtypes).
  void params_to_flat(int64_t a, int64_t b, at::Tensor t) const {
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t pa = std::max(a, offsets_[i]), pb = std::min(b, offsets_[i] + params_[i].second.numel());
      if (pa < pb) t.narrow(0, pa - a, pb - pa).copy_(flat(i).narrow(0, pa - offsets_[i], pb - pa));
    }
  }
  void flat_to_params(int64_t a, int64_t b, const at::Tensor& t) const {
    for (size_t i = 0; i < params_.size(); ++i) {
      const int64_t pa = std::max(a, offsets_[i]), pb = std::min(b, offsets_[i] + params_[i].second.numel());
      if (pa < pb) flat(i).narrow(0, pa - offsets_[i], pb - pa).copy_(t.narrow(0, pa - a, pb - pa));
    }
  }

  dist::ProcessGroup& pg_;
  bool sync_on_mode_switch_;
  bool shard_grads_;                     // ZeRO-2
  std::vector<at::Tensor> grad_pieces_;  // ZeRO-2: views of grad_shard_, per piece, for step()
  at::Tensor grad_shard_;                // ZeRO-2: this rank's summed gradient, [its range]
  std::vector<Bucket> buckets_;
  std::vector<size_t> bucket_of_;
  std::vector<int64_t> buffer_offset_;  // each parameter's position in its bucket's buffer
  int64_t bucket_bytes_ = 0;
  int64_t gather_bytes_ = int64_t{25} << 20;  // the parameters' all-gather, per rank and bucket
  bool rebuilt_ = false;                // buckets follow the observed arrival order
  std::vector<size_t> arrival_order_;   // this rank's, until then
  std::vector<bool> arrived_;
  size_t next_bucket_ = 0;  // the next bucket to send in this round
  int64_t rounds_ = 0;      // micro-batches (rounds of buckets) sent in this mini-batch
  InFlight in_flight_;
  std::vector<at::Tensor> sources_;  // tensors carrying the hooks
  std::vector<int64_t> offsets_, bounds_;
  at::ScalarType dtype_ = at::kFloat;       // the parameters' (their all-gather's bytes)
  at::Device device_ = at::kCPU;            // the parameters' (the gradient buckets and shard live there)
  at::ScalarType grad_dtype_ = at::kFloat;  // the gradients' buckets and shard
  std::map<at::ScalarType, SlotLayout> layouts_;
  std::vector<Piece> pieces_;
  std::unique_ptr<Optimizer> inner_;
};

// dist.shard_master_weights without sharded gradients (ZeRO-1, or one process): the
// parameters are bf16 and their gradients of each micro-batch are added into fp32
// accumulators (full size, 4 B/param, replicated as ZeRO-1's gradients are), so that
// accumulation over micro-batches happens in fp32 as with the default layout's fp32
// gradients. reduce_update() hands the accumulators to the parameters as their .grad(), so
// the all-reduce, clipping and the optimizer (whose fp32 masters take them) see fp32
// gradients; zero_grad() drops them. Everything else is the wrapped optimizer's.
class Fp32GradOptimizer final : public Optimizer {
 public:
  explicit Fp32GradOptimizer(std::unique_ptr<Optimizer> inner) : Optimizer(inner->params()), inner_(std::move(inner)) {}
  ~Fp32GradOptimizer() override { release(); }

  void step(double lr) override {
    inner_->step(lr);
    steps_ = inner_->step_count();
  }
  double lr_of_next_step(double scheduled) const override { return inner_->lr_of_next_step(scheduled); }
  void use_eval_weights() override { inner_->use_eval_weights(); }
  void use_train_weights() override { inner_->use_train_weights(); }
  OptimizerState state() const override { return inner_->state(); }
  void load_state(const OptimizerState& st) override {
    inner_->load_state(st);
    steps_ = inner_->step_count();
  }

  // After a micro-batch's backward: its (bf16) gradients added into the fp32 accumulators.
  void end_micro_batch() {
    c10::NoGradGuard no_grad;
    if (acc_.empty()) acc_.resize(params_.size());
    for (size_t i = 0; i < params_.size(); ++i) {
      at::Tensor& g = params_[i].second.mutable_grad();
      if (!g.defined()) continue;
      if (acc_[i].defined()) {
        acc_[i].add_(g);
      } else {
        acc_[i] = g.to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
        dist::memory::add(dist::memory::Kind::Gradients, static_cast<int64_t>(acc_[i].nbytes()));
      }
      g = at::Tensor();
    }
  }
  // Before the reduction: the accumulators become the parameters' gradients (fp32).
  void hand_over() {
    end_micro_batch();  // a gradient left by a backward without end_micro_batch()
    const bool together = dist::world() != nullptr;  // every rank all-reduces every gradient, in fp32
    for (size_t i = 0; i < acc_.size(); ++i) {
      at::Tensor& g = params_[i].second.mutable_grad();
      if (acc_[i].defined()) g = acc_[i];
      else if (together) g = at::zeros(params_[i].second.sizes(), at::TensorOptions().dtype(at::kFloat).device(params_[i].second.device()));
    }
    release();
  }
  const Optimizer& inner() const { return *inner_; }
  Optimizer& inner() { return *inner_; }

 private:
  void release() {
    for (const at::Tensor& a : acc_)
      if (a.defined()) dist::memory::add(dist::memory::Kind::Gradients, -static_cast<int64_t>(a.nbytes()));
    acc_.clear();
  }
  std::unique_ptr<Optimizer> inner_;
  std::vector<at::Tensor> acc_;
};

// The optimizer under a Fp32GradOptimizer, or itself.
const Optimizer& base_of(const Optimizer& o) {
  if (const auto* f = dynamic_cast<const Fp32GradOptimizer*>(&o)) return f->inner();
  return o;
}
Optimizer& base_of(Optimizer& o) {
  if (auto* f = dynamic_cast<Fp32GradOptimizer*>(&o)) return f->inner();
  return o;
}
const ShardedOptimizer* sharded_of(const Optimizer& o) { return dynamic_cast<const ShardedOptimizer*>(&base_of(o)); }
ShardedOptimizer* sharded_of(Optimizer& o) { return dynamic_cast<ShardedOptimizer*>(&base_of(o)); }

int64_t master_bytes_of(const OptimizerState& st) {
  int64_t n = 0;
  for (const auto& [k, t] : st.tensors)
    if (is_master_key(k)) n += static_cast<int64_t>(t.nbytes());
  return n;
}

}  // namespace

std::unique_ptr<Optimizer> make_sharded_optimizer(dist::ProcessGroup& pg, const OptimizerOptions& options,
                                                  NamedTensors params, bool shard_gradients, int64_t bucket_bytes) {
  return std::make_unique<ShardedOptimizer>(pg, options, std::move(params), shard_gradients, bucket_bytes);
}

std::unique_ptr<Optimizer> make_optimizer(const OptimizerOptions& options, NamedTensors params, int64_t zero_stage,
                                          int64_t bucket_bytes, bool fp32_gradients) {
  dist::ProcessGroup* pg = dist::world();
  std::unique_ptr<Optimizer> o;
  if (zero_stage >= 1 && pg) {
    o = make_sharded_optimizer(*pg, options, std::move(params), zero_stage >= 2, bucket_bytes);
    if (zero_stage >= 2) return o;  // ZeRO-2: its fp32 buckets and shard accumulate
  } else {
    o = train::make_optimizer(options, std::move(params));
  }
  if (fp32_gradients) return std::make_unique<Fp32GradOptimizer>(std::move(o));
  return o;
}

void init_master_weights(Optimizer& optimizer, const std::function<at::Tensor(const std::string&)>& master_of) {
  if (ShardedOptimizer* s = sharded_of(optimizer)) {
    s->init_master_weights(master_of);
    return;
  }
  c10::NoGradGuard no_grad;
  OptimizerState st = optimizer.state();
  for (const auto& [name, p] : optimizer.params()) {
    const at::Tensor full = master_of(name).detach().reshape(p.sizes());
    for (const char* slot : kStartsAtTheWeights)
      if (auto it = st.tensors.find(name + slot); it != st.tensors.end()) it->second.copy_(full);  // in place, as above
  }
  apply_masters(base_of(optimizer), st);
}

void attach_gradient_sources(Optimizer& optimizer, const std::vector<at::Tensor>& sources) {
  if (auto* s = sharded_of(optimizer)) s->attach_gradient_sources(sources);
}

void end_micro_batch(Optimizer& optimizer) {
  if (auto* f = dynamic_cast<Fp32GradOptimizer*>(&optimizer)) return f->end_micro_batch();
  if (auto* s = sharded_of(optimizer)) s->end_micro_batch();
}

void memory_metrics(const Optimizer& optimizer, std::map<std::string, double>& m) {
  using dist::memory::Kind;
  int64_t weights = 0, largest = 0;
  for (const auto& [name, p] : optimizer.params()) {
    weights += static_cast<int64_t>(p.nbytes());
    largest = std::max(largest, static_cast<int64_t>(p.nbytes()));
  }
  const int64_t masters = local_master_bytes(optimizer);
  m["perf/memory/grad_bytes_max"] = static_cast<double>(dist::memory::peak(Kind::Gradients));
  // The optimizer's own state (moments); fp32 master copies of bf16 parameters are counted
  // apart, as master_bytes (dist.shard_master_weights: this rank's 1/N).
  m["perf/memory/optimizer_state_bytes"] = static_cast<double>(local_state_bytes(optimizer) - masters);
  m["perf/memory/weight_bytes"] = static_cast<double>(weights);  // the optimizer's parameters (replicated)
  m["perf/memory/largest_param_bytes"] = static_cast<double>(largest);
  if (masters > 0) m["perf/memory/master_bytes"] = static_cast<double>(masters);
  if (const auto* s = sharded_of(optimizer); s && s->shards_gradients()) {
    m["perf/memory/grad_shard_bytes"] = static_cast<double>(s->shard_bytes());
    m["perf/memory/grad_bucket_bytes"] = static_cast<double>(s->bucket_capacity_bytes());
  }
  dist::memory::reset_peak(Kind::Gradients);
}

FlatRange flat_range(const Optimizer& optimizer) {
  if (const auto* s = sharded_of(optimizer)) return s->range();
  int64_t total = 0;
  for (const auto& [name, p] : optimizer.params()) total += p.numel();
  return {0, total, total};
}

OptimizerState local_state(const Optimizer& optimizer) {
  if (const auto* s = sharded_of(optimizer)) return s->local_state();
  return optimizer.state();
}

double clip_grad_norm(Optimizer& optimizer, double max_norm) {
  if (auto* s = sharded_of(optimizer); s && s->shards_gradients()) return s->clip_sharded_grads(max_norm);
  return train::clip_grad_norm(optimizer.params(), max_norm);
}

int64_t local_state_bytes(const Optimizer& optimizer) {
  if (const auto* s = sharded_of(optimizer)) return s->local_bytes();
  return state_bytes(optimizer.state());
}

int64_t local_master_bytes(const Optimizer& optimizer) { return master_bytes_of(local_state(optimizer)); }

void reduce_gradients(Optimizer& optimizer, const std::vector<at::Tensor>& params, size_t micro_batches) {
  if (auto* f = dynamic_cast<Fp32GradOptimizer*>(&optimizer)) f->hand_over();  // fp32 accumulators -> .grad()
  auto* sharded = sharded_of(optimizer);
  if (!(sharded && sharded->shards_gradients())) {
    int64_t bytes = 0;  // one process, ZeRO-0/1: the full gradients, at their largest
    for (const auto& p : params)
      if (p.grad().defined()) bytes += static_cast<int64_t>(p.grad().nbytes());
    dist::memory::observe(dist::memory::Kind::Gradients, bytes);
  }
  dist::ProcessGroup* pg = dist::world();
  if (!pg) return;
  if (sharded && sharded->shards_gradients())
    sharded->finish_gradients(static_cast<int64_t>(micro_batches));  // ZeRO-2: reduced during backward
  else
    dist::all_reduce_gradients(*pg, params);
}

}  // namespace rpg::train::dp
