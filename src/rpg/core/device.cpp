#include "rpg/core/device.h"

#include <dlfcn.h>
#include <link.h>

#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <vector>

#include "rpg/core/error.h"
#include "rpg/core/io.h"
#include "rpg/core/log.h"

namespace fs = std::filesystem;

namespace rpg::device {
namespace {

std::mutex g_mutex;
bool g_loaded = false;

std::string dl_error() {
  const char* e = dlerror();
  std::string s = e ? e : "unknown dlopen error";
  if (auto nl = s.find('\n'); nl != std::string::npos) s.resize(nl);
  return s;
}

bool disabled_by_env() {
  const char* v = std::getenv("RPG_CUDA_BACKEND");
  return v && std::strcmp(v, "0") == 0;
}

// Directory of the libtorch_cpu.so this process mapped (the CUDA backend must come from
// the same torch install).
fs::path torch_lib_dir() {
  fs::path found;
  dl_iterate_phdr(
      [](dl_phdr_info* info, size_t, void* data) -> int {
        if (!info->dlpi_name || !*info->dlpi_name) return 0;
        fs::path p(info->dlpi_name);
        if (p.filename() == "libtorch_cpu.so") {
          *static_cast<fs::path*>(data) = p.parent_path();
          return 1;
        }
        return 0;
      },
      &found);
  return found;
}

fs::path self_exe_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

}  // namespace

int driver_device_count(std::string* why) {
  auto say = [&](std::string s) {
    if (why) *why = std::move(s);
    return 0;
  };
  if (disabled_by_env()) return say("RPG_CUDA_BACKEND=0");
  void* h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!h) return say("no NVIDIA driver: " + dl_error());
  using InitFn = int (*)(unsigned);
  using CountFn = int (*)(int*);
  auto init = reinterpret_cast<InitFn>(dlsym(h, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(h, "cuDeviceGetCount"));
  int n = 0;
  int rc = -1;
  if (!init || !count) {
    dlclose(h);
    return say("libcuda.so.1 lacks cuInit/cuDeviceGetCount");
  }
  rc = init(0);
  if (rc == 0) rc = count(&n);
  if (rc != 0 || n <= 0) {
    dlclose(h);
    return say(rc != 0 ? str("the NVIDIA driver reports no usable device (CUresult ", rc, ")")
                       : std::string("the NVIDIA driver reports 0 devices"));
  }
  return n;  // the driver stays mapped: the CUDA runtime is about to use it
}

std::string load_cuda_backend() {
  std::lock_guard<std::mutex> lock(g_mutex);
  if (g_loaded) return "";
  if (disabled_by_env()) return "RPG_CUDA_BACKEND=0";
  fs::path dir = torch_lib_dir();
  if (dir.empty()) return "libtorch_cpu.so is not mapped in this process";
  fs::path lib = dir / "libtorch_cuda.so";
  if (!fs::exists(lib)) return str(lib.string(), " does not exist (a CPU-only torch install)");
  // RTLD_GLOBAL: libtorch_cuda_linalg.so and the CUDA plugin resolve symbols against it.
  if (!dlopen(lib.c_str(), RTLD_NOW | RTLD_GLOBAL)) return dl_error();
  g_loaded = true;
  // The optional plugin with rpg's own CUDA code (CUDA graphs, SDPA backend report):
  // $RPG_CUDA_PLUGIN, else librpg_cuda.so next to the executable or in the build tree.
  std::vector<fs::path> plugins;
  if (const char* p = std::getenv("RPG_CUDA_PLUGIN"); p && *p) plugins.emplace_back(p);
  if (fs::path d = self_exe_dir(); !d.empty()) plugins.push_back(d / "librpg_cuda.so");
#ifdef RPG_CUDA_PLUGIN_PATH
  plugins.emplace_back(RPG_CUDA_PLUGIN_PATH);
#endif
  for (const auto& p : plugins) {
    std::error_code ec;
    if (!fs::exists(p, ec)) continue;
    if (dlopen(p.c_str(), RTLD_NOW | RTLD_GLOBAL)) break;
    log_warn("CUDA plugin ", p.string(), " did not load (", dl_error(), "); CUDA graphs are off");
    break;
  }
  return "";
}

bool cuda_backend_loaded() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_loaded;
}

Kind select(const std::string& name, const std::string& what) {
  if (name == "cpu") return Kind::kCpu;
  if (name == "cuda") {
    std::string why;
    if (driver_device_count(&why) <= 0)
      throw ConfigError(str(what, ": cuda requested, but no CUDA GPU is usable here (", why, ")"));
    if (std::string err = load_cuda_backend(); !err.empty())
      throw ConfigError(str(what, ": cuda requested, but libtorch's CUDA backend did not load (", err, ")"));
    return Kind::kCuda;
  }
  if (name == "auto") {
    if (driver_device_count() <= 0) return Kind::kCpu;
    if (std::string err = load_cuda_backend(); !err.empty()) {
      log_warn(what, ": auto: a GPU is present but libtorch's CUDA backend did not load (", err, "); using cpu");
      return Kind::kCpu;
    }
    return Kind::kCuda;
  }
  throw ConfigError(str(what, ": got '", name, "', expected auto, cpu or cuda"));
}

std::optional<std::string> cuda_device_name(int index) {
  using NameFn = int (*)(int, char*, size_t);
  auto f = reinterpret_cast<NameFn>(dlsym(RTLD_DEFAULT, "rpg_cuda_device_name"));
  char name[256];
  if (!f || f(index, name, sizeof name) != 0) return std::nullopt;
  return std::string(name);
}

std::optional<CudaMemoryPeaks> cuda_memory_peaks(int index) {
  using PeaksFn = int (*)(int, int64_t*, int64_t*);
  auto f = reinterpret_cast<PeaksFn>(dlsym(RTLD_DEFAULT, "rpg_cuda_memory_peaks"));
  CudaMemoryPeaks p;
  if (!f || f(index, &p.allocated, &p.reserved) != 0) return std::nullopt;
  return p;
}

std::optional<int64_t> available_memory(bool cuda, int index) {
  if (!cuda) {
    const int64_t bytes = available_memory_bytes();
    return bytes >= 0 ? std::optional<int64_t>(bytes) : std::nullopt;
  }
  using AvailableFn = int (*)(int, int64_t*);
  auto f = reinterpret_cast<AvailableFn>(dlsym(RTLD_DEFAULT, "rpg_cuda_memory_available"));
  int64_t bytes = 0;
  if (!f || f(index, &bytes) != 0) return std::nullopt;
  return bytes;
}

}  // namespace rpg::device
