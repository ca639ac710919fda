// The fused RMSNorm and RoPE of the training and scoring forwards (fused_elementwise.h)
// against layer.cpp's ATen forms, which are transformers' op-by-op arithmetic:
// - forward values bit for bit (fp32 and bf16, widths that are and are not multiples of the
//   kernels' 16 lanes, one row and many);
// - RoPE's gradient bit for bit against ATen autograd's chain (the same rounding points), also
//   from a transposed gradient (the one SDPA hands back);
// - RMSNorm's gradients (their sums run in another order) against the same
//   formulas differentiated by autograd in fp64 from the same rounded inputs: the fused
//   gradient's error is at most ATen chain's own plus one rounding of the result, and in fp32
//   within 1e-5 relative of the chain;
// - inputs that do not need a gradient get none.
// The model-level check (gradients of every parameter against transformers, fp32) is
// HfParity.LogProbGradientsMatchTransformers, which runs through these paths.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "rpg/model/fused_elementwise.h"

namespace rpg::model {
namespace {

using detail::rms_norm_fused;
using detail::rope_fused;

// layer.cpp's ATen forms, written out here from transformers' modules.
at::Tensor rms_norm_aten(const at::Tensor& x, const at::Tensor& w, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  return w * (xf * at::rsqrt(xf.pow(2).mean(-1, true) + eps)).to(x.scalar_type());
}
at::Tensor rotate_half(const at::Tensor& x) {
  const int64_t h = x.size(-1) / 2;
  return at::cat({-x.narrow(-1, h, h), x.narrow(-1, 0, h)}, -1);
}
// cos, sin [B, T, 1, D] as transformers' rotary embedding makes them (plain sine).
at::Tensor rope_aten(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return x * cos + rotate_half(x) * sin;
}

// rope_tables' sign-folded sine, [-sin, sin] over the halves.
at::Tensor folded(const at::Tensor& sin) {
  const int64_t h = sin.size(-1) / 2;
  return at::cat({-sin.narrow(-1, 0, h), sin.narrow(-1, h, h)}, -1);
}

std::pair<at::Tensor, at::Tensor> tables(int64_t B, int64_t T, int64_t D, at::ScalarType dtype) {
  at::Tensor pos = at::arange(B * T, at::kFloat).view({B, T, 1, 1}) * 0.37;
  at::Tensor inv_freq = at::pow(10000.0, -at::arange(0, D / 2, at::kDouble) * 2.0 / D).to(at::kFloat);
  at::Tensor f = at::cat({pos * inv_freq, pos * inv_freq}, -1);  // [B, T, 1, D]
  return {f.cos().to(dtype), f.sin().to(dtype)};
}

std::vector<at::Tensor> grads(const at::Tensor& y, const std::vector<at::Tensor>& inputs, const at::Tensor& dy) {
  return torch::autograd::grad({y}, inputs, {dy});
}

double max_abs(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

const std::vector<at::ScalarType> kTypes = {at::kFloat, at::kBFloat16};

TEST(FusedElementwise, ForwardsAreTheAtenFormsBitForBit) {
  at::manual_seed(1);
  for (at::ScalarType dt : kTypes)
    for (int64_t C : {1, 7, 16, 40, 576}) {
      const std::string what = c10::toString(dt) + std::string(" C=") + std::to_string(C);
      for (int64_t rows : {int64_t{1}, int64_t{3}, 4096 / C + 5}) {
        at::Tensor x = (at::randn({rows, C}) * 3).to(dt), w = (at::rand({C}) + 0.5).to(dt);
        EXPECT_TRUE(at::equal(rms_norm_fused(x, w, 1e-6), rms_norm_aten(x, w, 1e-6))) << what << " rows " << rows;
      }
    }
  for (at::ScalarType dt : kTypes)
    for (int64_t D : {2, 8, 64, 80}) {
      const int64_t B = 3, T = 37, H = 5;
      auto [cos, sin] = tables(B, T, D, dt);
      at::Tensor x = at::randn({B, T, H, D}).to(dt);
      EXPECT_TRUE(at::equal(rope_fused(x, cos, folded(sin)), rope_aten(x, cos, sin)))
          << c10::toString(dt) << " D=" << D;
    }
}

TEST(FusedElementwise, RopeGradientIsAtenChainsBitForBit) {
  at::manual_seed(2);
  for (at::ScalarType dt : kTypes)
    for (bool transposed : {false, true}) {
      const int64_t B = 2, T = 29, H = 3, D = 64;
      auto [cos, sin] = tables(B, T, D, dt);
      at::Tensor x = at::randn({B, T, H, D}).to(dt).requires_grad_();
      // The gradient SDPA hands back: [B, H, T, D] contiguous, seen as [B, T, H, D].
      at::Tensor dy = transposed ? at::randn({B, H, T, D}).to(dt).transpose(1, 2) : at::randn({B, T, H, D}).to(dt);
      at::Tensor fused = grads(rope_fused(x, cos, folded(sin)), {x}, dy)[0];
      at::Tensor chain = grads(rope_aten(x, cos, sin), {x}, dy)[0];
      EXPECT_TRUE(at::equal(fused, chain)) << c10::toString(dt) << (transposed ? " transposed" : "");
    }
}

// The fused gradient is no farther from the fp64 gradient than ATen's chain, plus one rounding
// of the result (bf16: 2^-8 of its magnitude); fp32: within 1e-5 relative of the chain.
void expect_like_chain(const at::Tensor& fused, const at::Tensor& chain, const at::Tensor& exact, at::ScalarType dt,
                       const std::string& what) {
  const double scale = exact.abs().max().item<double>();
  const double err_fused = max_abs(fused, exact), err_chain = max_abs(chain, exact);
  std::printf("[ measure  ] %-34s max |grad - fp64| fused %.3g, ATen chain %.3g (scale %.3g)\n", what.c_str(),
              err_fused, err_chain, scale);
  if (dt == at::kBFloat16) EXPECT_LE(err_fused, err_chain + scale / 256) << what;
  else EXPECT_LE(max_abs(fused, chain), 1e-5 * scale) << what;
}

TEST(FusedElementwise, RmsNormGradientsMatchAtenChainAndFp64) {
  at::manual_seed(3);
  for (at::ScalarType dt : kTypes)
    for (int64_t C : {7, 64, 576}) {
      const int64_t rows = 300;
      at::Tensor x0 = (at::randn({rows, C}) * 2).to(dt), w0 = (at::rand({C}) + 0.5).to(dt);
      at::Tensor dy = at::randn({rows, C}).to(dt);
      at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
      auto fused = grads(rms_norm_fused(x, w, 1e-5), {x, w}, dy);
      auto chain = grads(rms_norm_aten(x, w, 1e-5), {x, w}, dy);
      at::Tensor xd = x0.to(at::kDouble).requires_grad_(), wd = w0.to(at::kDouble).requires_grad_();
      auto exact = grads(wd * (xd * at::rsqrt(xd.pow(2).mean(-1, true) + 1e-5)), {xd, wd}, dy.to(at::kDouble));
      const std::string what = c10::toString(dt) + std::string(" C=") + std::to_string(C);
      expect_like_chain(fused[0], chain[0], exact[0], dt, "rms_norm dx " + what);
      expect_like_chain(fused[1], chain[1], exact[1], dt, "rms_norm dw " + what);
      EXPECT_EQ(fused[0].scalar_type(), dt);
      EXPECT_EQ(fused[1].scalar_type(), dt);
    }
}

TEST(FusedElementwise, InputsWithoutGradGetNone) {
  at::Tensor x = at::randn({5, 16}).requires_grad_(), w = at::rand({16});
  at::Tensor y = rms_norm_fused(x, w, 1e-6);
  EXPECT_TRUE(y.requires_grad());
  auto gx = grads(y, {x}, at::ones_like(y));
  EXPECT_TRUE(gx[0].defined());
  at::Tensor w2 = at::rand({16}).requires_grad_();
  at::Tensor y2 = rms_norm_fused(at::randn({5, 16}), w2, 1e-6);
  EXPECT_TRUE(grads(y2, {w2}, at::ones_like(y2))[0].defined());
  at::Tensor q = at::randn({1, 3, 2, 8}).requires_grad_();
  auto [cos, sin] = tables(1, 3, 8, at::kFloat);
  EXPECT_TRUE(rope_fused(q, cos, folded(sin)).requires_grad());
  EXPECT_FALSE(rope_fused(q.detach(), cos, folded(sin)).requires_grad());
  // Nothing needs a gradient: no graph.
  EXPECT_FALSE(rms_norm_fused(at::randn({2, 8}), at::rand({8}), 1e-6).requires_grad());
}

}  // namespace
}  // namespace rpg::model
