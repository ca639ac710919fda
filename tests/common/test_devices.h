// The devices every device-generic torch test runs on, from one parametrisation:
//
//   class MyTest : public ::testing::TestWithParam<at::Device> {};
//   INSTANTIATE_TEST_SUITE_P(Devices, MyTest, ::testing::ValuesIn(rpg::test::rpg_test_devices()),
//                            rpg::test::DeviceParamName());
//
// CPU always; CUDA when the NVIDIA driver reports a GPU and libtorch's CUDA backend loads
// (rpg::device::select("auto"), the same path as `--device auto`). The CUDA instances are
// named ".../cuda", so a GPU machine runs them with --gtest_filter='*/cuda*' and needs no
// extra test code. RPG_TEST_DEVICES (a comma list: "cuda", "cpu,cuda") replaces the default;
// a listed device that is not available ends the test binary with one line and exit code 1
// at registration: a GPU run never passes by skipping its CUDA tests.
#pragma once

#include <c10/core/Device.h>
#include <gtest/gtest.h>

#include <string>
#include <tuple>
#include <vector>

namespace rpg::test {

std::vector<at::Device> rpg_test_devices();

// "cpu", "cuda".
std::string device_name(const at::Device& device);

struct DeviceParamName {
  std::string operator()(const ::testing::TestParamInfo<at::Device>& info) const { return device_name(info.param); }
};

// For ::testing::Combine(<strings>, ValuesIn(rpg_test_devices())): "<string>_<device>".
struct NameDeviceParamName {
  std::string operator()(const ::testing::TestParamInfo<std::tuple<std::string, at::Device>>& info) const {
    return std::get<0>(info.param) + "_" + device_name(std::get<1>(info.param));
  }
};

// A tolerance for comparisons of differently ordered fp32 sums: `cpu_tol` on the CPU, 10x
// on CUDA (fused SDPA and cuBLAS kernels reorder sums; TF32 stays off in libtorch matmuls).
double fp32_tol(const at::Device& device, double cpu_tol);

}  // namespace rpg::test
