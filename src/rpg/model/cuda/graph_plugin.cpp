// librpg_cuda.so: rpg's CUDA-specific code, loaded by core/device.cpp right after libtorch's
// CUDA backend (never on a CPU run). Exports one C entry point found by cuda_graph.cpp.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <exception>
#include <stdexcept>
#include <functional>
#include <memory>
#include <string>

#include "rpg/model/cuda_graph.h"

namespace {

class Graph final : public rpg::model::StepGraph {
 public:
  void replay() override { graph_.replay(); }
  at::cuda::CUDAGraph graph_;
  c10::MempoolId_t pool_{0, 0};  // graph_.pool() is not const
};

}  // namespace

extern "C" __attribute__((visibility("default"))) rpg::model::StepGraph* rpg_cuda_capture_graph(
    const std::function<void()>* step, const rpg::model::StepGraph* share_pool_with, std::string* error) {
  try {
    auto g = std::make_unique<Graph>();
    c10::MempoolId_t pool{0, 0};  // {0, 0}: a private pool of its own
    if (share_pool_with) {
      auto* other = dynamic_cast<const Graph*>(share_pool_with);
      if (!other) throw std::invalid_argument("share_pool_with is not a graph of this plugin");
      pool = other->pool_;
    }
    c10::cuda::device_synchronize();  // the step's inputs, written on the current stream
    {
      // Capture must not run on the legacy default stream; warm up on the same side stream.
      c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
      (*step)();
      c10::cuda::device_synchronize();
      g->graph_.capture_begin(pool);
      (*step)();
      g->graph_.capture_end();
      g->pool_ = g->graph_.pool();
    }
    c10::cuda::device_synchronize();
    return g.release();
  } catch (const std::exception& e) {
    std::string m = e.what();
    if (auto nl = m.find('\n'); nl != std::string::npos) m.resize(nl);
    *error = m;
    return nullptr;
  }
}
