// librpg_cuda.so, part 2 (compiled only when the torch wheel ships NCCL's headers): the NCCL
// process group for rpg/dist. The core and dist libraries link no CUDA library; when the
// training device is CUDA, dist/process_group.cpp finds this C entry point with dlsym in the
// plugin that core/device.cpp loaded, and keeps Gloo for CPU tensors and its store-based
// fault diagnosis.
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <string>

// Creates c10d::ProcessGroupNCCL on `store` (the same rendezvous store as the Gloo group;
// the caller gives it its own prefix) for `rank` of `size`, every collective under
// `timeout_ms`. Selects CUDA device `local_rank` modulo the visible devices first (one GPU
// per rank on a node, torchrun's convention). Returns the backend with one reference owned
// by the caller (c10::intrusive_ptr<c10d::Backend>::reclaim), or nullptr with the reason
// (one line) in *error.
extern "C" __attribute__((visibility("default"))) c10d::Backend* rpg_cuda_nccl_group(
    const c10::intrusive_ptr<c10d::Store>* store, int rank, int size, std::int64_t timeout_ms, int local_rank,
    std::string* error) {
  try {
    const int devices = c10::cuda::device_count();
    if (devices <= 0) {
      *error = "no CUDA device is visible";
      return nullptr;
    }
    c10::cuda::set_device(static_cast<c10::DeviceIndex>(local_rank % devices));
    // Blocking wait: a collective's wait() returns when it is done (rpg's collectives are
    // blocking) and throws on an NCCL error or after the timeout, so the caller names the
    // lost rank as for Gloo. Unless the user set it.
    setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
    auto options = c10d::ProcessGroupNCCL::Options::create();
    options->timeout = std::chrono::milliseconds(timeout_ms);
    auto pg = c10::make_intrusive<c10d::ProcessGroupNCCL>(*store, rank, size, options);
    c10::intrusive_ptr<c10d::Backend> backend = pg;
    return backend.release();
  } catch (const std::exception& e) {
    std::string m = e.what();
    if (auto nl = m.find('\n'); nl != std::string::npos) m.resize(nl);
    *error = m;
    return nullptr;
  }
}
