// The fused RMSNorm and RoPE of the training and scoring forwards (fused_elementwise.h)
// against layer.cpp's ATen forms, which are transformers' op-by-op arithmetic:
// - forward values bit for bit (fp32 and bf16, widths that are and are not multiples of the
//   kernels' 16 lanes, one row and many);
// - RoPE's gradient bit for bit against ATen autograd's chain (the same rounding points), also
//   from a transposed gradient (the one SDPA hands back);
// - RMSNorm's gradients bit for bit against ATen autograd's chain (its two sums are ATen's own
//   reductions over the same intermediate tensors), for rows of the residual stream and of
//   q_norm's heads, alone and beside a residual (fp32: the association of x's three terms);
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

TEST(FusedElementwise, RmsNormGradientsAreAtenChainsBitForBit) {
  at::manual_seed(3);
  for (at::ScalarType dt : kTypes)
    for (int64_t C : {7, 64, 576}) {
      const std::string what = c10::toString(dt) + std::string(" C=") + std::to_string(C);
      // [B, T, C] as the residual stream, and [B, T, H, C] as q_norm's heads.
      for (const std::vector<int64_t>& shape : {std::vector<int64_t>{3, 100, C}, std::vector<int64_t>{2, 30, 5, C}}) {
        at::Tensor x0 = (at::randn(shape) * 2).to(dt), w0 = (at::rand({C}) + 0.5).to(dt), dy = at::randn(shape).to(dt);
        at::Tensor x = x0.clone().requires_grad_(), w = w0.clone().requires_grad_();
        auto fused = grads(rms_norm_fused(x, w, 1e-5), {x, w}, dy);
        auto chain = grads(rms_norm_aten(x, w, 1e-5), {x, w}, dy);
        EXPECT_TRUE(at::equal(fused[0], chain[0])) << what << " dx, max diff " << max_abs(fused[0], chain[0]);
        EXPECT_TRUE(at::equal(fused[1], chain[1])) << what << " dw, max diff " << max_abs(fused[1], chain[1]);
        EXPECT_EQ(fused[1].scalar_type(), dt);
        // With the residual beside it, as in a layer: x's gradient sums three terms in fp32 (the
        // residual's, then x * inv's, then x^2's), in the chain's association.
        auto fused_res = grads(x + rms_norm_fused(x, w, 1e-5), {x, w}, dy);
        auto chain_res = grads(x + rms_norm_aten(x, w, 1e-5), {x, w}, dy);
        EXPECT_TRUE(at::equal(fused_res[0], chain_res[0])) << what << " dx with the residual, max diff "
                                                           << max_abs(fused_res[0], chain_res[0]);
        EXPECT_TRUE(at::equal(fused_res[1], chain_res[1])) << what << " dw with the residual";
      }
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
