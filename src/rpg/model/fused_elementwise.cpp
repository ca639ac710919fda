#include "rpg/model/fused_elementwise.h"

#include <ATen/ATen.h>
#include <ATen/ExpandUtils.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstdint>
#include <type_traits>

#include "rpg/core/cpu_clones.h"
#include "rpg/model/elementwise_loops.h"

// at::parallel_for's OpenMP region is compiled into this file (src/rpg/model/CMakeLists.txt).
#if !defined(_OPENMP)
#error "this kernel file must be compiled with -fopenmp"
#endif

namespace rpg::model::detail {

using namespace loops;
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

// ---- RMSNorm ------------------------------------------------------------------------------

template <class T>
RPG_INLINE void rms_norm_forward_t(const T* x, const T* w, const float* inv, T* y, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; ++r) scale_row(x + r * C, w, y + r * C, C, inv[r]);
}

// The backward of y = w * n, n = (x * inv).to(T), inv = rsqrt(mean(x^2) + eps), as ATen's chain
// computes it. Its two sums are ATen's own (at::sum_to, as MulBackward reduces a broadcast
// operand's gradient), over the very tensors the chain sums, written by the first pass:
//   prod = float(dn) * x, dn = dy * w rounded to T, summed per row into d_inv;
//   dwn = dy * n rounded to T, summed over the rows into dw.
// The second pass makes x's two gradient terms, each operation where the chain makes it (no
// contraction: -ffp-contract=off): through x * inv, dn * inv; through x^2,
// (d_var / C) * (2 * x) with d_var = (-0.5 * d_inv) * inv^3. bf16: their sum, rounded (the
// chain's fp32 copy of x receives both, then its ToCopyBackward rounds); fp32: apart (see
// RmsNormFn).
template <class T>
RPG_INLINE void rms_norm_backward_terms_t(const T* __restrict dy, const T* __restrict x, const T* __restrict w,
                                          const float* __restrict inv, float* __restrict prod, T* __restrict dwn,
                                          int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *dyr = dy + r * C, *xr = x + r * C;
    float* pr = prod + r * C;
    T* nr = dwn ? dwn + r * C : nullptr;
    const float ir = inv[r];
    auto one = [&](int64_t k) RPG_INLINE_LAMBDA {
      pr[k] = round_to<T>(load(dyr[k]) * load(w[k])) * load(xr[k]);
    };
    auto weight_term = [&](int64_t k) RPG_INLINE_LAMBDA {
      store(nr + k, load(dyr[k]) * round_to<T>(load(xr[k]) * ir));
    };
    int64_t k = 0;
    for (; k + kLanes <= C; k += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) one(k + j);
    for (; k < C; ++k) one(k);
    if (!nr) continue;
    for (k = 0; k + kLanes <= C; k += kLanes)
      for (int64_t j = 0; j < kLanes; ++j) weight_term(k + j);
    for (; k < C; ++k) weight_term(k);
  }
}

// dx = the two terms summed (bf16), or dx = the x * inv term and dx_pow = the x^2 term (fp32).
template <class T>
RPG_INLINE void rms_norm_backward_dx_t(const T* __restrict dy, const T* __restrict x, const T* __restrict w,
                                       const float* __restrict inv, const float* __restrict d_inv, T* __restrict dx,
                                       T* __restrict dx_pow, int64_t rows, int64_t C) {
  for (int64_t r = 0; r < rows; ++r) {
    const T *dyr = dy + r * C, *xr = x + r * C;
    T* dxr = dx + r * C;
    const float ir = inv[r];
    const float d_var_per_c = ((-0.5f * d_inv[r]) * (ir * ir * ir)) / static_cast<float>(C);
    auto through_scale = [&](int64_t k) RPG_INLINE_LAMBDA { return round_to<T>(load(dyr[k]) * load(w[k])) * ir; };
    auto through_square = [&](int64_t k) RPG_INLINE_LAMBDA { return d_var_per_c * (2.0f * load(xr[k])); };
    int64_t k = 0;
    if (dx_pow) {
      T* pr = dx_pow + r * C;
      for (; k + kLanes <= C; k += kLanes)
        for (int64_t j = 0; j < kLanes; ++j) store(dxr + k + j, through_scale(k + j)), store(pr + k + j, through_square(k + j));
      for (; k < C; ++k) store(dxr + k, through_scale(k)), store(pr + k, through_square(k));
    } else {
      for (; k + kLanes <= C; k += kLanes)
        for (int64_t j = 0; j < kLanes; ++j) store(dxr + k + j, through_scale(k + j) + through_square(k + j));
      for (; k < C; ++k) store(dxr + k, through_scale(k) + through_square(k));
    }
  }
}

RPG_CPU_CLONES void rms_norm_forward_f32(const float* x, const float* w, const float* inv, float* y, int64_t rows,
                                         int64_t C) {
  rms_norm_forward_t(x, w, inv, y, rows, C);
}
RPG_CPU_CLONES void rms_norm_forward_bf16(const uint16_t* x, const uint16_t* w, const float* inv, uint16_t* y,
                                          int64_t rows, int64_t C) {
  rms_norm_forward_t(x, w, inv, y, rows, C);
}
RPG_CPU_CLONES void rms_norm_backward_terms_f32(const float* dy, const float* x, const float* w, const float* inv,
                                                float* prod, float* dwn, int64_t rows, int64_t C) {
  rms_norm_backward_terms_t(dy, x, w, inv, prod, dwn, rows, C);
}
RPG_CPU_CLONES void rms_norm_backward_terms_bf16(const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                                                 const float* inv, float* prod, uint16_t* dwn, int64_t rows, int64_t C) {
  rms_norm_backward_terms_t(dy, x, w, inv, prod, dwn, rows, C);
}
RPG_CPU_CLONES void rms_norm_backward_dx_f32(const float* dy, const float* x, const float* w, const float* inv,
                                             const float* d_inv, float* dx, float* dx_pow, int64_t rows, int64_t C) {
  rms_norm_backward_dx_t(dy, x, w, inv, d_inv, dx, dx_pow, rows, C);
}
RPG_CPU_CLONES void rms_norm_backward_dx_bf16(const uint16_t* dy, const uint16_t* x, const uint16_t* w,
                                              const float* inv, const float* d_inv, uint16_t* dx, int64_t rows,
                                              int64_t C) {
  rms_norm_backward_dx_t(dy, x, w, inv, d_inv, dx, static_cast<uint16_t*>(nullptr), rows, C);
}

// x comes in twice (x_again is x): in fp32 the chain's x feeds x^2 and x * inv directly, so x's
// gradient buffer receives their two terms apart, after the residual's (whose AddBackward runs
// first), and sums ((residual + scale term) + square term). One node output per use of x keeps
// that association: the engine adds a node's outputs in order. bf16 returns one term (the
// chain's ToCopyBackward's) and none for x_again.
struct RmsNormFn : public torch::autograd::Function<RmsNormFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& /*x_again*/,
                            const at::Tensor& weight, double eps) {
    RECORD_FUNCTION("rpg::rms_norm_fused", std::vector<c10::IValue>());
    // inv by ATen's own ops on the [rows, 1] statistics: mean's summation order is ATen's.
    const int64_t C = x.size(-1), rows = x.numel() / C;
    const at::Tensor inv = at::rsqrt(x.to(at::kFloat).pow(2).mean(-1, /*keepdim=*/true) + eps).contiguous();
    at::Tensor y = at::empty_like(x);
    const float* ip = inv.data_ptr<float>();
    with_elements(y, [&](auto* yp) {
      using T = std::remove_pointer_t<decltype(yp)>;
      const T *xp = elements<T>(x), *wp = elements<T>(weight);
      at::parallel_for(0, rows, grain(C), [&](int64_t b, int64_t e) {
        if constexpr (std::is_same_v<T, float>) rms_norm_forward_f32(xp + b * C, wp, ip + b, yp + b * C, e - b, C);
        else rms_norm_forward_bf16(xp + b * C, wp, ip + b, yp + b * C, e - b, C);
      });
    });
    ctx->save_for_backward({x, weight, inv});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_FUNCTION("rpg::rms_norm_fused_backward", std::vector<c10::IValue>());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &x = saved[0], &weight = saved[1], &inv = saved[2];
    const at::Tensor dy = grads[0].contiguous();
    const int64_t C = x.size(-1), rows = x.numel() / C;
    const bool x_grad = ctx->needs_input_grad(0), weight_grad = ctx->needs_input_grad(2);
    const bool fp32 = x.scalar_type() == at::kFloat;
    at::Tensor prod = at::empty(x.sizes(), x.options().dtype(at::kFloat));
    at::Tensor dwn = weight_grad ? at::empty_like(x) : at::Tensor();
    at::Tensor dx = at::empty_like(x), dx_pow = fp32 && x_grad ? at::empty_like(x) : at::Tensor();
    const float* ip = inv.data_ptr<float>();
    float* pp = prod.data_ptr<float>();
    with_elements(dx, [&](auto* dxp) {
      using T = std::remove_pointer_t<decltype(dxp)>;
      const T *dyp = elements<T>(dy), *xp = elements<T>(x), *wp = elements<T>(weight);
      T* np = weight_grad ? static_cast<T*>(dwn.data_ptr()) : nullptr;
      at::parallel_for(0, rows, grain(C), [&](int64_t b, int64_t e) {
        T* nb = np ? np + b * C : nullptr;
        if constexpr (std::is_same_v<T, float>)
          rms_norm_backward_terms_f32(dyp + b * C, xp + b * C, wp, ip + b, pp + b * C, nb, e - b, C);
        else
          rms_norm_backward_terms_bf16(dyp + b * C, xp + b * C, wp, ip + b, pp + b * C, nb, e - b, C);
      });
      if (!x_grad) return;  // a frozen input (LoRA): the weight's gradient only
      const at::Tensor d_inv = at::sum_to(prod, inv.sizes()).contiguous();
      const float* dp = d_inv.data_ptr<float>();
      at::parallel_for(0, rows, grain(C), [&](int64_t b, int64_t e) {
        if constexpr (std::is_same_v<T, float>)
          rms_norm_backward_dx_f32(dyp + b * C, xp + b * C, wp, ip + b, dp + b, dxp + b * C,
                                   dx_pow.data_ptr<float>() + b * C, e - b, C);
        else
          rms_norm_backward_dx_bf16(dyp + b * C, xp + b * C, wp, ip + b, dp + b, dxp + b * C, e - b, C);
      });
    });
    at::Tensor dw = weight_grad ? at::sum_to(dwn, weight.sizes()) : at::Tensor();
    return {x_grad ? dx : at::Tensor(), x_grad ? dx_pow : at::Tensor(), dw, at::Tensor()};
  }
};

// ---- RoPE ---------------------------------------------------------------------------------

// y [positions, H, D] (contiguous) = rotate_head of x's head rows, x strided by (bt_outer,
// bt_inner, head) over positions p = outer * inner_size + inner: the backward's gradient comes
// as a transposed view of SDPA's [B, H, T, D] one.
template <class T>
RPG_INLINE void rope_strided_t(const T* x, int64_t outer_stride, int64_t inner_stride, int64_t head_stride,
                               int64_t inner_size, const T* cos, const T* sin, T* y, int64_t p0, int64_t p1,
                               int64_t H, int64_t D) {
  for (int64_t p = p0; p < p1; ++p) {
    const T* xp = x + (p / inner_size) * outer_stride + (p % inner_size) * inner_stride;
    for (int64_t h = 0; h < H; ++h) rotate_head(xp + h * head_stride, cos + p * D, sin + p * D, y + (p * H + h) * D, D);
  }
}
RPG_CPU_CLONES void rope_strided_f32(const float* x, int64_t so, int64_t si, int64_t sh, int64_t inner, const float* c,
                                     const float* s, float* y, int64_t p0, int64_t p1, int64_t H, int64_t D) {
  rope_strided_t(x, so, si, sh, inner, c, s, y, p0, p1, H, D);
}
RPG_CPU_CLONES void rope_strided_bf16(const uint16_t* x, int64_t so, int64_t si, int64_t sh, int64_t inner,
                                      const uint16_t* c, const uint16_t* s, uint16_t* y, int64_t p0, int64_t p1,
                                      int64_t H, int64_t D) {
  rope_strided_t(x, so, si, sh, inner, c, s, y, p0, p1, H, D);
}

// x * cos + swap_halves(x) * sin for x [B, T, H, D] whose last dimension is contiguous.
at::Tensor rope_pass(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const int64_t B = x.size(0), T = x.size(1), H = x.size(2), D = x.size(3);
  at::Tensor y = at::empty({B, T, H, D}, x.options());
  with_elements(y, [&](auto* yp) {
    using E = std::remove_pointer_t<decltype(yp)>;
    const E *xp = elements<E>(x), *cp = elements<E>(cos), *sp = elements<E>(sin);
    at::parallel_for(0, B * T, grain(H * D), [&](int64_t b, int64_t e) {
      if constexpr (std::is_same_v<E, float>)
        rope_strided_f32(xp, x.stride(0), x.stride(1), x.stride(2), T, cp, sp, yp, b, e, H, D);
      else
        rope_strided_bf16(xp, x.stride(0), x.stride(1), x.stride(2), T, cp, sp, yp, b, e, H, D);
    });
  });
  return y;
}

// y_j = x_j c_j + x_p(j) s_j (p swaps the halves), so dx_j = dy_j c_j + dy_p(j) s_p(j): the
// forward's pass with the sine table's halves swapped, rounded where ATen's chain rounds
// (dy * cos, dy * sin, their sum): the same bits as that chain.
struct RopeFn : public torch::autograd::Function<RopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    RECORD_FUNCTION("rpg::rope_fused", std::vector<c10::IValue>());
    ctx->save_for_backward({cos, sin});
    return rope_pass(x, cos, sin);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    RECORD_FUNCTION("rpg::rope_fused_backward", std::vector<c10::IValue>());
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &cos = saved[0], &sin = saved[1];
    const int64_t D = sin.size(-1);
    const at::Tensor sin_swapped = sin.view({-1, 2, D / 2}).flip(1).reshape(sin.sizes()).contiguous();
    at::Tensor dy = grads[0];
    if (dy.stride(3) != 1) dy = dy.contiguous();
    return {rope_pass(dy, cos, sin_swapped), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool fused_elementwise_applies(const at::Tensor& x) {
  return x.defined() && x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
         x.is_contiguous();
}

bool rms_norm_fused_applies(const at::Tensor& x, const at::Tensor& weight) {
  return fused_elementwise_applies(x) && fused_elementwise_applies(weight) && weight.scalar_type() == x.scalar_type() &&
         weight.dim() == 1 && x.dim() >= 1 && x.size(-1) == weight.size(0);
}

bool rope_fused_applies(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  return fused_elementwise_applies(x) && x.dim() == 4 && x.size(-1) % 2 == 0 && fused_elementwise_applies(cos) &&
         fused_elementwise_applies(sin) && cos.scalar_type() == x.scalar_type() &&
         sin.scalar_type() == x.scalar_type() && cos.dim() == 4 && cos.size(0) == x.size(0) &&
         cos.size(1) == x.size(1) && cos.size(2) == 1 && cos.size(3) == x.size(3) && sin.sizes() == cos.sizes();
}

at::Tensor rms_norm_fused(const at::Tensor& x, const at::Tensor& weight, double eps) {
  TORCH_CHECK(rms_norm_fused_applies(x, weight),
              "rms_norm_fused: contiguous float32 or bfloat16 CPU x [..., C] and weight [C] of its dtype");
  return RmsNormFn::apply(x, x, weight, eps);
}

at::Tensor rope_fused(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(rope_fused_applies(x, cos, sin),
              "rope_fused: contiguous float32 or bfloat16 CPU x [B, T, H, D] and cos, sin [B, T, 1, D] of its dtype");
  return RopeFn::apply(x, cos, sin);
}

}  // namespace rpg::model::detail
