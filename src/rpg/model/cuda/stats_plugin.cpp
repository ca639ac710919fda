// librpg_cuda.so: what verl reads from torch.cuda for its perf metrics, as C entry points that
// core/device.cpp finds with dlsym (so nothing outside the plugin includes CUDA headers).
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>

#include <cstdint>
#include <cstring>
#include <exception>

namespace {

c10::DeviceIndex pick(int device) {
  return device < 0 ? c10::cuda::current_device() : static_cast<c10::DeviceIndex>(device);
}

}  // namespace

// The device's name as torch.cuda.get_device_name gives it ("NVIDIA H200"), NUL-terminated
// and cut to `size` bytes. 0 on success.
extern "C" __attribute__((visibility("default"))) int rpg_cuda_device_name(int device, char* out, size_t size) {
  try {
    const cudaDeviceProp* p = at::cuda::getDeviceProperties(pick(device));
    if (!p || size == 0) return 1;
    std::strncpy(out, p->name, size - 1);
    out[size - 1] = '\0';
    return 0;
  } catch (const std::exception&) {
    return 1;
  }
}

// The caching allocator's peaks since the process started: torch.cuda.max_memory_allocated
// and max_memory_reserved (memory_stats()["allocated_bytes.all.peak"] / "reserved_bytes.all.peak").
// 0 on success.
extern "C" __attribute__((visibility("default"))) int rpg_cuda_memory_peaks(int device, int64_t* allocated,
                                                                           int64_t* reserved) {
  try {
    using c10::CachingAllocator::StatType;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(pick(device));
    *allocated = stats.allocated_bytes[static_cast<size_t>(StatType::AGGREGATE)].peak;
    *reserved = stats.reserved_bytes[static_cast<size_t>(StatType::AGGREGATE)].peak;
    return 0;
  } catch (const std::exception&) {
    return 1;
  }
}

// Memory a new allocation can still get on the device: the driver's free bytes
// (cudaMemGetInfo) plus what torch's caching allocator holds reserved but unallocated. 0 on
// success.
extern "C" __attribute__((visibility("default"))) int rpg_cuda_memory_available(int device, int64_t* available) {
  try {
    const c10::DeviceIndex index = pick(device);
    c10::cuda::CUDAGuard guard(index);
    size_t free_bytes = 0, total_bytes = 0;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return 1;
    using c10::CachingAllocator::StatType;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    const auto agg = static_cast<size_t>(StatType::AGGREGATE);
    *available = static_cast<int64_t>(free_bytes) + stats.reserved_bytes[agg].current - stats.allocated_bytes[agg].current;
    return 0;
  } catch (const std::exception&) {
    return 1;
  }
}
