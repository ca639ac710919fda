// CUDA graphs without CUDA headers: rpg's CUDA code lives in the plugin librpg_cuda.so
// (src/rpg/model/cuda/graph_plugin.cpp), which core/device.cpp loads together with libtorch's
// CUDA backend, so a CPU run never maps it. Here only the interface, found with dlsym.
#pragma once

#include <functional>
#include <memory>
#include <string>

namespace rpg::model {

// A captured sequence of CUDA work, replayed with one launch. Tensors the captured work
// reads and writes stay at the addresses they had at capture: refill inputs in place
// (copy_), read outputs after replay().
class StepGraph {
 public:
  virtual ~StepGraph() = default;
  virtual void replay() = 0;
};

// Whether the plugin is loaded (a CUDA device was selected and librpg_cuda.so was found).
bool cuda_graphs_available();

// Runs `step` once on a side stream (warm-up: allocator, cuBLAS workspaces), then captures
// it into a graph. The step must not read tensors back to the host nor change shapes.
// `share_pool_with`: a graph captured earlier whose memory pool this one takes too (the
// memory of one graph's intermediates instead of one per graph). Only for graphs that never
// replay concurrently and whose steps read nothing a previous replay left in the pool: every
// input and output a tensor allocated outside the captures, as the rollout engine's steps.
// Throws rpg::ValueError naming the reason when the plugin is absent or capture fails.
std::unique_ptr<StepGraph> capture_cuda_graph(const std::function<void()>& step,
                                              const StepGraph* share_pool_with = nullptr);

}  // namespace rpg::model
