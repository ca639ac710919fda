// libtorch is linked and usable: autograd on a small graph matches the closed form.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/autograd.h>

TEST(TorchSmoke, AutogradMatchesClosedFormGradient) {
  at::manual_seed(0);
  at::Tensor x = at::randn({5, 3}, at::kDouble).requires_grad_(true);
  at::Tensor w = at::randn({3}, at::kDouble).requires_grad_(true);
  // f = sum_ij sin(x_ij) * w_j^2 + sum_j exp(w_j)
  at::Tensor f = (at::sin(x) * w.pow(2)).sum() + w.exp().sum();
  f.backward();
  at::Tensor dx = at::cos(x.detach()) * w.detach().pow(2);
  at::Tensor dw = 2 * w.detach() * at::sin(x.detach()).sum(0) + w.detach().exp();
  EXPECT_TRUE(at::allclose(x.grad(), dx, 1e-12, 1e-12));
  EXPECT_TRUE(at::allclose(w.grad(), dw, 1e-12, 1e-12));
}

TEST(TorchSmoke, SecondOrderGradient) {
  at::Tensor x = at::tensor({0.3, -1.2, 2.0}, at::kDouble).requires_grad_(true);
  at::Tensor y = x.pow(3).sum();
  auto g = torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true, /*create_graph=*/true)[0];
  auto h = torch::autograd::grad({g.sum()}, {x})[0];
  EXPECT_TRUE(at::allclose(h, 6 * x.detach(), 1e-12, 1e-12));
}
