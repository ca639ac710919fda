#include "test_devices.h"

#include <ATen/Context.h>

#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "rpg/core/device.h"
#include "rpg/core/error.h"

namespace rpg::test {
namespace {

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "rpg test devices: %s\n", message.c_str());
  std::fflush(stderr);
  std::exit(1);
}

std::vector<at::Device> compute() {
  const char* env = std::getenv("RPG_TEST_DEVICES");
  if (!env || !*env) {
    std::vector<at::Device> out{at::kCPU};
    if (device::select("auto") == device::Kind::kCuda && at::hasCUDA()) out.emplace_back(at::kCUDA, 0);
    return out;
  }
  std::vector<at::Device> out;
  std::stringstream ss(env);
  std::string name;
  while (std::getline(ss, name, ',')) {
    if (name == "cpu") {
      out.emplace_back(at::kCPU);
    } else if (name == "cuda") {
      try {
        device::select("cuda", "RPG_TEST_DEVICES");
      } catch (const Error& e) {
        die(e.what());
      }
      if (!at::hasCUDA()) die("RPG_TEST_DEVICES: cuda: the CUDA backend loaded but torch sees no CUDA device");
      out.emplace_back(at::kCUDA, 0);
    } else {
      die("RPG_TEST_DEVICES: got '" + name + "', expected a comma list of cpu and cuda");
    }
  }
  if (out.empty()) die("RPG_TEST_DEVICES: empty list");
  return out;
}

}  // namespace

std::vector<at::Device> rpg_test_devices() {
  static const std::vector<at::Device> devices = compute();
  return devices;
}

std::string device_name(const at::Device& device) { return device.is_cuda() ? "cuda" : "cpu"; }

double fp32_tol(const at::Device& device, double cpu_tol) { return device.is_cuda() ? 10 * cpu_tol : cpu_tol; }

}  // namespace rpg::test
