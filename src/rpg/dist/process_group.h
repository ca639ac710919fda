// A process group on PyTorch's c10d: a TCPStore on MASTER_ADDR:MASTER_PORT (rank 0 hosts
// it) for the rendezvous, ProcessGroupGloo for CPU tensors and, when the group is created
// for the CUDA device (GroupOptions::device), ProcessGroupNCCL for CUDA tensors. The NCCL
// group comes from the CUDA plugin librpg_cuda.so (model/cuda/nccl_plugin.cpp, found with
// dlsym once core/device.cpp has loaded it): this library links no CUDA library. The
// collectives block until done (NCCL's with blocking wait, under the same timeout).
//
// Faults: every collective runs under `timeout`. When one fails (a peer's connection
// reset, a timeout), the group finds out which rank is at fault through the store before
// throwing DistError: each rank keeps a heartbeat counter in the store (a background
// thread, every `heartbeat`) and, on failure, publishes the collective it failed in. A
// rank whose heartbeat stopped is "lost" (died or stopped); a live rank that never
// reported the failing collective "did not reach" it (hung or diverged); if rank 0 (the
// store's host) is gone, the store is unreachable and rank 0 is named. After a failure
// the group is broken: later calls throw at once, and its c10d objects are deliberately
// not destroyed (their destructors can block on dead peers).
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "rpg/core/device.h"
#include "rpg/core/error.h"
#include "rpg/dist/layout.h"

namespace at {
class Tensor;
}

namespace rpg::dist {

// A collective failed: the message names the lost rank when it could be found.
class DistError : public Error {
 public:
  DistError(const std::string& message, int lost_rank) : Error(message), lost_rank_(lost_rank) {}
  int lost_rank() const { return lost_rank_; }  // -1 when unknown

 private:
  int lost_rank_;
};

enum class ReduceOp { Sum, Max, Min };

class ProcessGroup;

// A collective started by one of ProcessGroup's *_async calls: it runs in the backend's
// own threads (Gloo's work queue) while the caller goes on. wait() blocks until it is
// done and fails as the blocking calls do (DistError naming the lost rank). The tensors
// it reads or writes must stay alive and untouched until then (the handle keeps them).
// Call wait() before using the result; destroying a handle does not wait.
class Pending {
 public:
  Pending();
  ~Pending();
  Pending(Pending&&) noexcept;
  Pending& operator=(Pending&&) noexcept;
  void wait();
  bool valid() const { return state_ != nullptr; }

 private:
  friend class ProcessGroup;
  struct State;
  std::unique_ptr<State> state_;
};

struct GroupOptions {
  // verl's default for trainer.nccl_timeout is 600 s.
  std::chrono::milliseconds timeout{std::chrono::seconds(600)};
  std::chrono::milliseconds heartbeat{std::chrono::milliseconds(500)};
  // The training device. kCuda: an NCCL group is created beside the Gloo one (CUDA device
  // LOCAL_RANK modulo the visible ones becomes the current device) and collectives on CUDA
  // tensors go to it; CPU tensors, barrier() and the fault diagnosis stay on Gloo and the
  // store. When NCCL is unavailable (no plugin, or a plugin built without NCCL's headers)
  // init() throws ConfigError naming why.
  device::Kind device = device::Kind::kCpu;
};

class ProcessGroup {
 public:
  // Joins the group described by `layout` (every rank must call it); blocks until all
  // world_size ranks are connected or `options.timeout` passes (DistError naming the
  // ranks that never arrived).
  static std::unique_ptr<ProcessGroup> init(const RankLayout& layout, const GroupOptions& options = {});
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  int rank() const;
  int size() const;
  const RankLayout& layout() const;

  // In place on every rank; tensors must be contiguous, on the CPU (Gloo) or, in a group
  // created for CUDA, on the current CUDA device (NCCL).
  void all_reduce(at::Tensor& tensor, ReduceOp op = ReduceOp::Sum);
  void broadcast(at::Tensor& tensor, int root);
  // Every rank's `tensor` (same shape everywhere), concatenated along dim 0 in rank order.
  at::Tensor all_gather(const at::Tensor& tensor);
  // `input`'s dim 0 is split into size() equal chunks; rank r gets the reduction of
  // every rank's chunk r.
  at::Tensor reduce_scatter(const at::Tensor& input, ReduceOp op = ReduceOp::Sum);
  void barrier();
  // Sums (or reduces by `op`) every rank's `tensor` into rank `root`'s `tensor`, without
  // blocking: the others' `tensor` is scratch afterwards. Collectives started this way are
  // matched across ranks in the order they are started, like the blocking ones.
  Pending reduce_async(const at::Tensor& tensor, int root, ReduceOp op = ReduceOp::Sum);

  // Number of collectives issued so far (named in fault messages).
  long collectives() const;
  // Whether collectives on CUDA tensors go to NCCL (a group created for kCuda).
  bool has_nccl() const;

 private:
  struct Impl;
  friend class Pending;
  explicit ProcessGroup(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace rpg::dist
