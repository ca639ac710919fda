// The process group on each test device (test_devices.h): on CUDA a group created for the
// CUDA device runs its collectives on CUDA tensors through NCCL (one rank: the GPU machine
// has one GPU, and NCCL refuses two ranks on one device); on the CPU two ranks (threads of
// this process, over loopback) run them through Gloo. Results against closed forms.
// scripts/gpu_check.sh runs the CUDA instances (filter '*cuda*'; dry run: '*OnDevice.*').
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <cstdlib>
#include <future>
#include <vector>

#include "rpg/core/device.h"
#include "rpg/dist/launch.h"
#include "rpg/dist/process_group.h"
#include "test_devices.h"

namespace rpg::dist {
namespace {

class GroupOnDevice : public ::testing::TestWithParam<at::Device> {};

std::vector<double> values(const at::Tensor& t) {
  at::Tensor c = t.to(at::kCPU, at::kDouble).contiguous();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

struct RankResult {
  bool nccl = false;
  std::vector<double> sum, max, broadcast, gathered, scattered, cpu_sum;
  bool on_device = true;
  std::string error;
};

// Rank r of w on `device`; inputs as tests/dist/dist_worker's.
RankResult run_rank(const at::Device& device, int r, int w, int port) {
  RankResult out;
  try {
    RankLayout layout;
    layout.rank = r;
    layout.world_size = w;
    layout.local_rank = r;
    layout.local_world_size = w;
    layout.master_addr = "127.0.0.1";
    layout.master_port = port;
    GroupOptions options;
    options.timeout = std::chrono::seconds(60);
    options.device = device.is_cuda() ? device::Kind::kCuda : device::Kind::kCpu;
    auto pg = ProcessGroup::init(layout, options);
    out.nccl = pg->has_nccl();
    const auto f = at::TensorOptions().dtype(at::kFloat).device(device);
    auto check = [&](const at::Tensor& t) { out.on_device = out.on_device && t.device().type() == device.type(); };

    at::Tensor s = at::tensor({1.0, 2.0, 10.0}, f) * at::tensor({double(r + 1), double(r + 1), 1.0}, f);
    pg->all_reduce(s);
    check(s), out.sum = values(s);
    at::Tensor m = at::tensor({double(r), double(5 - r)}, f);
    pg->all_reduce(m, ReduceOp::Max);
    check(m), out.max = values(m);
    at::Tensor b = r == w - 1 ? at::tensor({7.0, 8.0}, f) : at::zeros({2}, f);
    pg->broadcast(b, w - 1);
    check(b), out.broadcast = values(b);
    at::Tensor g = pg->all_gather(at::tensor({10.0 * r, 10.0 * r + 1}, f));
    check(g), out.gathered = values(g);
    at::Tensor rs = pg->reduce_scatter(at::arange(2 * w, f) * double(r + 1));
    check(rs), out.scattered = values(rs);
    // CPU tensors stay on Gloo in a CUDA group.
    at::Tensor c = at::full({2}, double(r + 1), at::kFloat);
    pg->all_reduce(c);
    out.cpu_sum = values(c);
    pg->barrier();
  } catch (const std::exception& e) {
    out.error = e.what();
  }
  return out;
}

TEST_P(GroupOnDevice, CollectivesMatchClosedForms) {
  const at::Device device = GetParam();
  const int w = device.is_cuda() ? 1 : 2;
  const int port = free_port();
  std::vector<std::future<RankResult>> futures;
  for (int r = 0; r < w; ++r)
    futures.push_back(std::async(std::launch::async, [=] { return run_rank(device, r, w, port); }));
  const double s = w * (w + 1) / 2.0;
  for (int r = 0; r < w; ++r) {
    RankResult got = futures[r].get();
    ASSERT_EQ(got.error, "") << "rank " << r;
    EXPECT_EQ(got.nccl, device.is_cuda()) << "NCCL backend present iff the group is for CUDA";
    EXPECT_TRUE(got.on_device) << "a collective's result left " << device;
    EXPECT_EQ(got.sum, (std::vector<double>{s, 2 * s, 10.0 * w}));
    EXPECT_EQ(got.max, (std::vector<double>{double(w - 1), 5.0}));
    EXPECT_EQ(got.broadcast, (std::vector<double>{7.0, 8.0}));
    std::vector<double> gathered;
    for (int k = 0; k < w; ++k) gathered.push_back(10.0 * k), gathered.push_back(10.0 * k + 1);
    EXPECT_EQ(got.gathered, gathered);
    EXPECT_EQ(got.scattered, (std::vector<double>{2 * r * s, (2 * r + 1) * s}));
    EXPECT_EQ(got.cpu_sum, (std::vector<double>{s, s}));
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, GroupOnDevice, ::testing::ValuesIn(rpg::test::rpg_test_devices()),
                         rpg::test::DeviceParamName());

// A one-rank group on loopback for trainer.device=cuda.
std::unique_ptr<ProcessGroup> init_one_cuda_rank() {
  RankLayout layout;
  layout.world_size = 1;
  layout.local_world_size = 1;
  layout.master_addr = "127.0.0.1";
  layout.master_port = free_port();
  GroupOptions options;
  options.device = device::Kind::kCuda;
  return ProcessGroup::init(layout, options);
}

// A group for the CUDA device without a usable CUDA backend / NCCL plugin: one-line
// ConfigError naming why, before anything connects.
TEST(GroupNccl, UnavailableIsOneLineConfigError) {
  if (device::cuda_backend_loaded()) GTEST_SKIP() << "the CUDA backend is loaded in this process (a GPU machine)";
  setenv("RPG_CUDA_BACKEND", "0", 1);
  try {
    init_one_cuda_rank();
    ADD_FAILURE() << "no error";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_EQ(m.find('\n'), std::string::npos) << m;
    EXPECT_NE(m.find("dist: trainer.device is cuda, but NCCL is unavailable"), std::string::npos) << m;
    EXPECT_NE(m.find("RPG_CUDA_BACKEND=0"), std::string::npos) << m;
  }
  unsetenv("RPG_CUDA_BACKEND");
}

// Without a GPU the whole CUDA path up to NCCL still runs here: libtorch's CUDA backend and
// librpg_cuda.so load, dlsym finds the plugin's factory, and the factory reports that no
// CUDA device is visible (DistError naming the rank). On a GPU machine the CUDA instance of
// GroupOnDevice covers this path instead.
TEST(GroupNccl, PluginFactoryRunsWithoutAGpu) {
  std::string why;
  if (device::driver_device_count(&why) > 0) GTEST_SKIP() << "a GPU is present: GroupOnDevice/cuda covers this";
  unsetenv("RPG_CUDA_BACKEND");
  try {
    init_one_cuda_rank();
    ADD_FAILURE() << "no error without a GPU";
  } catch (const DistError& e) {
    EXPECT_EQ(std::string(e.what()), "dist: rank 0 cannot create its NCCL process group: no CUDA device is visible");
  }
  EXPECT_TRUE(device::cuda_backend_loaded());
}

}  // namespace
}  // namespace rpg::dist
