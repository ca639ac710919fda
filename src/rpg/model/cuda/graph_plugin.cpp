// librpg_cuda.so: rpg's CUDA-specific code, loaded by core/device.cpp right after libtorch's
// CUDA backend (never on a CPU run). Exports one C entry point found by cuda_graph.cpp.
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <exception>
#include <functional>
#include <memory>
#include <string>

#include "rpg/model/cuda_graph.h"

namespace {

class Graph final : public rpg::model::StepGraph {
 public:
  void replay() override { graph_.replay(); }
  at::cuda::CUDAGraph graph_;
};

}  // namespace

extern "C" __attribute__((visibility("default"))) rpg::model::StepGraph* rpg_cuda_capture_graph(
    const std::function<void()>* step, std::string* error) {
  try {
    auto g = std::make_unique<Graph>();
    c10::cuda::device_synchronize();  // the step's inputs, written on the current stream
    {
      // Capture must not run on the legacy default stream; warm up on the same side stream.
      c10::cuda::CUDAStreamGuard guard(c10::cuda::getStreamFromPool());
      (*step)();
      c10::cuda::device_synchronize();
      g->graph_.capture_begin();
      (*step)();
      g->graph_.capture_end();
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
