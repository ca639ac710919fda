// A rank of the process-group tests: joins the group from the launcher's environment and
// runs a scenario; prints one line per result ("name v1 v2 ..."), which the tests compare
// with closed-form values. Errors as rpg prints them: `rpg: error: ...`, exit 1.
//   dist_worker collectives          every collective once
//   dist_worker kill RANK            RANK SIGKILLs itself after the first all_reduce
//   dist_worker hang RANK            RANK sleeps through the second all_reduce (then exits)
//   dist_worker fail RANK            RANK throws an rpg error after the first all_reduce
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <thread>

#include "rpg/core/error.h"
#include "rpg/dist/process_group.h"

namespace {

void print(const std::string& name, const at::Tensor& t) {
  std::cout << name;
  at::Tensor d = t.to(at::kDouble).contiguous();
  for (int64_t i = 0; i < d.numel(); ++i) std::cout << " " << d.data_ptr<double>()[i];
  std::cout << std::endl;
}

int run(int argc, char** argv) {
  std::string mode = argc > 1 ? argv[1] : "collectives";
  int victim = argc > 2 ? std::atoi(argv[2]) : -1;
  rpg::dist::GroupOptions options;
  options.timeout = std::chrono::seconds(mode == "hang" ? 3 : 60);
  options.heartbeat = std::chrono::milliseconds(200);
  auto layout = rpg::dist::layout_from_env();
  auto pg = rpg::dist::ProcessGroup::init(layout, options);
  const int r = pg->rank(), w = pg->size();
  std::cout << "joined " << r << " " << w << std::endl;

  at::Tensor a = torch::tensor({r + 1.0, 2.0 * (r + 1), 10.0}, torch::kDouble);
  pg->all_reduce(a);
  print("sum", a);
  if (mode == "kill" && r == victim) raise(SIGKILL);
  if (mode == "fail" && r == victim) throw rpg::ValueError("worker failed on purpose");
  if (mode == "hang" && r == victim) {
    std::this_thread::sleep_for(std::chrono::seconds(8));
    std::cout << "woke" << std::endl;
    _exit(0);
  }
  at::Tensor m = torch::tensor({static_cast<float>(r), static_cast<float>(5 - r)});
  pg->all_reduce(m, rpg::dist::ReduceOp::Max);
  print("max", m);
  at::Tensor mn = torch::tensor({static_cast<int64_t>(r) + 5}, torch::kLong);
  pg->all_reduce(mn, rpg::dist::ReduceOp::Min);
  print("min", mn);
  at::Tensor b = r == w - 1 ? torch::tensor({7.0f, 8.0f}) : torch::zeros({2});
  pg->broadcast(b, w - 1);
  print("broadcast", b);
  print("all_gather", pg->all_gather(torch::tensor({10.0f * r, 10.0f * r + 1})));
  print("reduce_scatter", pg->reduce_scatter(torch::arange(2 * w, torch::kFloat) * (r + 1)));
  pg->barrier();
  std::cout << "collectives " << pg->collectives() << std::endl;
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const rpg::Error& e) {
    std::cout.flush();
    std::fprintf(stderr, "rpg: error: %s\n", e.what());
    return 1;
  }
}
