// Device selection (core/device.h through rollout::parse_device): a CPU run maps no CUDA
// library, `--device cuda` without a GPU is one clear line, the binary needs no CUDA
// library to start, and libtorch's CUDA backend loads on demand (also on a machine without
// a GPU or driver: its CUDA hooks register; torch then sees no device).
//
// The checks that inspect /proc/self/maps run in a fresh child process of this binary (a
// DISABLED_ test run by name, RPG_TEST_DEVICES=cpu so that registration selects no GPU):
// what other tests of the parent mapped or queried cannot leak into them.
#include <ATen/ATen.h>
#include <ATen/detail/CUDAHooksInterface.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "rpg/core/build_info.h"
#include "rpg/core/device.h"
#include "rpg/core/error.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/config.h"
#include "rpg/model/cuda_graph.h"
#include "rpg/rollout/engine.h"
#include "rpg/rollout/policy.h"
#include "test_devices.h"
#include "test_util.h"

namespace rpg::rollout {
namespace {

// The CUDA backend's libraries: libtorch's (450 MB of kernels), the NVIDIA libraries only
// it needs, the driver, rpg's CUDA plugin. (libtorch_cpu.so of a CUDA wheel itself needs
// libcudart and libcupti, a few MB, for its profiler: those are mapped in every run and
// are not the backend.)
const char* const kBackendLibs[] = {"libtorch_cuda", "libc10_cuda", "libcublas", "libcudnn", "libnccl",
                                    "libcusparse",   "libcufft",    "libcuda.so", "librpg_cuda"};

// Lines of /proc/self/maps that name one of them.
std::vector<std::string> cuda_mappings() {
  std::ifstream f("/proc/self/maps");
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);)
    for (const char* lib : kBackendLibs)
      if (line.find(lib) != std::string::npos) {
        out.push_back(line);
        break;
      }
  return out;
}

bool gpu_present() { return device::driver_device_count() > 0; }

// Runs DISABLED_<name> of DeviceChild in a fresh process of this binary; its exit code
// and output.
test::ProcessResult run_child(const std::string& name) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  return test::run_process({self, "--gtest_also_run_disabled_tests", "--gtest_filter=DeviceChild.DISABLED_" + name},
                           {"RPG_TEST_DEVICES=cpu"});
}

// ---- children ------------------------------------------------------------------------

// A CPU run: device selection, a model's forward, backward and the engine's decode.
TEST(DeviceChild, DISABLED_CpuRun) {
  at::Device dev = parse_device("cpu");
  ASSERT_TRUE(dev.is_cpu());
  at::manual_seed(1);
  model::CausalLM m(model::ModelConfig::from_json(
                        R"({"model_type": "qwen2", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 48,
                            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2})",
                        "test config"),
                    at::kFloat, dev);
  at::Tensor ids = at::randint(1, 64, {2, 6}, at::kLong);
  m.log_probs(ids, {}, {}, ids.narrow(1, 1, 5)).log_probs.sum().backward();
  RolloutEngine engine(m, {2, 0});
  SamplingParams p;
  p.max_new_tokens = 4;
  EXPECT_EQ(engine.generate({{1, 2, 3}, {4, 5}}, p).size(), 2u);
  EXPECT_FALSE(device::cuda_backend_loaded());
  // The perf-metric queries (the trainer asks only for a CUDA policy) load nothing either.
  EXPECT_FALSE(device::cuda_device_name(-1).has_value());
  EXPECT_FALSE(device::cuda_memory_peaks(-1).has_value());
  auto maps = cuda_mappings();
  EXPECT_TRUE(maps.empty()) << "a CPU run mapped: " << maps.front();
  // auto on a machine without a GPU: the CPU, still nothing mapped (on a GPU machine the
  // probe keeps the driver mapped, so this half runs only without one).
  if (!gpu_present()) {
    EXPECT_TRUE(parse_device("auto").is_cpu());
    maps = cuda_mappings();
    EXPECT_TRUE(maps.empty()) << "auto without a GPU mapped: " << maps.front();
  }
}

// The backend loaded directly, before any CUDA query: its hooks register (the CUDA
// runtime's version is known), and without a driver torch sees no device.
TEST(DeviceChild, DISABLED_LoadBackend) {
  ASSERT_TRUE(cuda_mappings().empty());
  ASSERT_EQ(device::load_cuda_backend(), "");
  EXPECT_TRUE(device::cuda_backend_loaded());
  EXPECT_EQ(device::load_cuda_backend(), "");  // idempotent
  EXPECT_FALSE(cuda_mappings().empty());
  EXPECT_GT(at::detail::getCUDAHooks().versionCUDART(), 0);  // the stub would throw
  EXPECT_EQ(at::hasCUDA(), gpu_present());
  // rpg's CUDA plugin (built wherever the wheel has the CUDA backend) loads with it, next to
  // the executable (a carried bundle) or in the build tree, and exports its entry point.
  const auto exe_dir = std::filesystem::read_symlink("/proc/self/exe").parent_path();
  const bool plugin = std::filesystem::exists(exe_dir / "librpg_cuda.so") ||
                      std::filesystem::exists(std::filesystem::path(RPG_BINARY_DIR) / "librpg_cuda.so");
  EXPECT_TRUE(plugin) << "librpg_cuda.so is not built";
  EXPECT_TRUE(model::cuda_graphs_available());
  // Its perf queries answer for a device that exists and fail cleanly (no abort) otherwise.
  EXPECT_EQ(device::cuda_device_name(0).has_value(), gpu_present());
  EXPECT_EQ(device::cuda_memory_peaks(0).has_value(), gpu_present());
  EXPECT_FALSE(device::cuda_device_name(-1).has_value() && !gpu_present());
  EXPECT_FALSE(device::cuda_device_name(1 << 20).has_value());
}

// ---- the tests -----------------------------------------------------------------------

TEST(DeviceSelection, ACpuRunMapsNoCudaLibrary) {
  auto r = run_child("CpuRun");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[  PASSED  ] 1 test"), std::string::npos) << r.out;
}

TEST(DeviceSelection, TheCudaBackendLoadsOnDemandAndRegistersItsHooks) {
  auto r = run_child("LoadBackend");
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("[  PASSED  ] 1 test"), std::string::npos) << r.out;
}

TEST(DeviceSelection, CudaWithoutAGpuIsOneClearLine) {
  if (gpu_present()) {  // the GPU machine: cuda is selected instead
    EXPECT_TRUE(parse_device("cuda").is_cuda());
    return;
  }
  try {
    parse_device("cuda");
    FAIL() << "no error";
  } catch (const ConfigError& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.starts_with("device: cuda requested, but no CUDA GPU is usable here (")) << msg;
    EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  }
  EXPECT_THROW(parse_device("gpu"), ConfigError);
  // The same through the CLI: one line on stderr, exit 1, before the model is read.
  auto r = test::run_process({test::rpg_binary().string(), "generate", "--model", "/nonexistent", "--device", "cuda",
                              "--prompt", "hi"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_TRUE(r.err.starts_with("rpg: error: device: cuda requested, but no CUDA GPU is usable here (")) << r.err;
  EXPECT_EQ(r.err.find('\n'), r.err.size() - 1) << r.err;
}

// verl's perf/max_memory_{allocated,reserved}_gb and the device name its MFU table is keyed by
// (torch.cuda.max_memory_allocated / max_memory_reserved / get_device_name), through the
// plugin: on CUDA a 64 MiB tensor raises the allocated peak to at least that, the reserved
// peak covers it, and the name is the driver's; a CPU tensor counts in neither.
class PerfQueries : public ::testing::TestWithParam<at::Device> {};

TEST_P(PerfQueries, AllocatorPeaksCountTheDevicesTensorsOnly) {
  const at::Device dev = GetParam();
  constexpr int64_t kBytes = int64_t{64} << 20;
  const auto before = device::cuda_memory_peaks(-1);
  at::Tensor t = at::ones({kBytes / 4}, at::TensorOptions().dtype(at::kFloat).device(dev));
  (void)t.sum().item<float>();
  const auto after = device::cuda_memory_peaks(-1);
  if (!dev.is_cuda()) {
    ASSERT_EQ(after.has_value(), before.has_value());
    if (after) {
      EXPECT_EQ(after->allocated, before->allocated) << "a CPU tensor counted on the GPU";
    }
    return;
  }
  ASSERT_TRUE(after.has_value()) << "the CUDA plugin is not loaded";
  EXPECT_GE(after->allocated, kBytes);
  EXPECT_GE(after->reserved, after->allocated);
  const auto name = device::cuda_device_name(static_cast<int>(dev.index()));
  ASSERT_TRUE(name.has_value());
  EXPECT_FALSE(name->empty());
  std::printf("[ perf ] %s: max allocated %.3f GiB, max reserved %.3f GiB\n", name->c_str(),
              static_cast<double>(after->allocated) / (1 << 30), static_cast<double>(after->reserved) / (1 << 30));
}

INSTANTIATE_TEST_SUITE_P(Devices, PerfQueries, ::testing::ValuesIn(test::rpg_test_devices()), test::DeviceParamName());

TEST(DeviceSelection, TheBinaryNeedsNoCudaLibraryToStart) {
  // build/rpg is the torch-free front; the commands that compute run in build/rpg-torch.
  const auto torch_binary = test::rpg_binary().parent_path() / "rpg-torch";
  auto r = test::run_process({"/usr/bin/ldd", torch_binary.string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("libtorch_cpu.so"), std::string::npos) << r.out;
  for (const char* lib : kBackendLibs) EXPECT_EQ(r.out.find(lib), std::string::npos) << lib << " in\n" << r.out;
  auto v = test::run_process({test::rpg_binary().string(), "version"});
  EXPECT_EQ(v.exit_code, 0) << v.err;
}

}  // namespace
}  // namespace rpg::rollout
