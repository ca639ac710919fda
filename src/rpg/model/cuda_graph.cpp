#include "rpg/model/cuda_graph.h"

#include <dlfcn.h>

#include "rpg/core/error.h"

namespace rpg::model {
namespace {

// The plugin's entry point (graph_plugin.cpp): a new graph, or nullptr with *error set.
using CaptureFn = StepGraph* (*)(const std::function<void()>* step, const StepGraph* share_pool_with,
                                 std::string* error);

CaptureFn capture_fn() { return reinterpret_cast<CaptureFn>(dlsym(RTLD_DEFAULT, "rpg_cuda_capture_graph")); }

}  // namespace

bool cuda_graphs_available() { return capture_fn() != nullptr; }

std::unique_ptr<StepGraph> capture_cuda_graph(const std::function<void()>& step, const StepGraph* share_pool_with) {
  CaptureFn f = capture_fn();
  if (!f) throw ValueError("CUDA graphs: the plugin librpg_cuda.so is not loaded (no CUDA device selected, or not built)");
  std::string error;
  StepGraph* g = f(&step, share_pool_with, &error);
  if (!g) throw ValueError("CUDA graphs: capture failed: " + error);
  return std::unique_ptr<StepGraph>(g);
}

}  // namespace rpg::model
