// Device selection and on-demand loading of libtorch's CUDA backend.
//
// The rpg binary links only libtorch's CPU libraries. libtorch_cuda.so (from the same torch
// install, found next to the loaded libtorch_cpu.so) costs every process about +0.2 s and
// +350 MiB peak RSS when it is mapped, GPU or not, so it is dlopen'ed here only when a run
// asks for "cuda", or asks for "auto" and the NVIDIA driver reports a GPU. Its static
// initialisers register the CUDA hooks, allocator and kernels with libtorch_cpu, so the
// load must happen before anything queries CUDA (at::hasCUDA(), at::manual_seed, a CUDA
// tensor): libtorch caches the CUDA hooks on the first query. Device-selecting code
// (rollout::parse_device, the tests' device list) calls select() first; a CPU run never
// maps a CUDA library.
//
// Torch-free: the caller turns the Kind into an at::Device.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace rpg::device {

enum class Kind { kCpu, kCuda };

// Number of CUDA devices the NVIDIA driver reports (libcuda.so.1 through dlopen: cuInit,
// cuDeviceGetCount); 0 when there is no driver or no visible device, with the reason in
// `why` when given. The driver library is unmapped again when it reports no device.
int driver_device_count(std::string* why = nullptr);

// dlopen's libtorch_cuda.so from the directory of the loaded libtorch_cpu.so (and the
// optional CUDA plugin librpg_cuda.so, see cuda_plugin.h). Idempotent. Returns "" on
// success, else the reason (one line).
std::string load_cuda_backend();
bool cuda_backend_loaded();

// "cpu" -> kCpu. "cuda" -> kCuda after loading the backend; ConfigError (one line naming
// the reason) when no GPU is visible or the backend does not load. "auto" -> kCuda when the
// driver reports a GPU and the backend loads (a backend that fails to load is one warning
// line, then kCpu), else kCpu without loading anything. Anything else: ConfigError.
// `what` names the setting in messages ("device", "trainer.device", "--device").
Kind select(const std::string& name, const std::string& what = "device");

// What verl's perf metrics read from torch.cuda, from the CUDA plugin (librpg_cuda.so,
// model/cuda/stats_plugin.cpp); nullopt where it is not loaded (every CPU run) or the query
// fails. `index` < 0: the current device.
// torch.cuda.get_device_name: picks the peak FLOP/s for perf/mfu/* (verl's table).
std::optional<std::string> cuda_device_name(int index);
// torch.cuda.max_memory_allocated / max_memory_reserved (bytes, peaks since the start).
struct CudaMemoryPeaks {
  int64_t allocated = 0, reserved = 0;
};
std::optional<CudaMemoryPeaks> cuda_memory_peaks(int index);

// Bytes a new allocation can still get: MemAvailable of /proc/meminfo for the CPU (`cuda`
// false); for CUDA device `index` the driver's free memory plus what torch's caching
// allocator holds unused (the plugin). nullopt where neither can be read.
std::optional<int64_t> available_memory(bool cuda, int index);

// The environment variable RPG_CUDA_BACKEND=0 makes "auto" pick the CPU and "cuda" an
// error without touching the driver (for runs that must stay CPU-only on a GPU machine).

}  // namespace rpg::device
