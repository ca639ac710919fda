// The CPU decode kernels. skinny_linear_kernel against at::linear in fp64 (tile and tail
// shapes, with and without bias) and linear_for_decode's choice of path; the decode-attention
// kernel against attention written out with ATen ops (scores,
// masked softmax, weighted sum in fp64) and against SDPA: shapes with and without grouped
// query heads, head dims that are and are not multiples of the kernel's 16 lanes, rows at
// different positions reading permuted slots, fp32 and bf16. The model-level paths that use
// it (decode, decode_all_slots, the engine) are checked against the full forward and
// transformers in hf_parity_test.cpp and model_unit_test.cpp.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <c10/core/GradMode.h>

#include "rpg/model/decode_attention.h"
#include "rpg/model/skinny_linear.h"

namespace rpg::model {
namespace {

struct Shape {
  int64_t slots, rows, heads, kv_heads, head_dim, capacity;
};

// softmax(q k^T / sqrt(D)) v over keys 0..pos of each row's slot, in fp64 from the same
// (rounded) inputs; head h reads KV head h / (H / Hkv).
at::Tensor reference(const at::Tensor& q, const at::Tensor& kt, const at::Tensor& v, const at::Tensor& slots,
                     const at::Tensor& pos) {
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), Hkv = v.size(1), rep = H / Hkv;
  at::Tensor out = at::zeros({R, H * D}, at::kDouble);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t s = slots[r].item<int64_t>(), n = pos[r].item<int64_t>() + 1;
    for (int64_t h = 0; h < H; ++h) {
      at::Tensor k = kt[s][h / rep].narrow(1, 0, n).t().to(at::kDouble);  // [n, D]
      at::Tensor vv = v[s][h / rep].narrow(0, 0, n).to(at::kDouble);
      at::Tensor p = at::softmax(at::mv(k, q[r][h].to(at::kDouble)) / std::sqrt(static_cast<double>(D)), 0);
      out[r].narrow(0, h * D, D).copy_(at::mv(vv.t(), p));
    }
  }
  return out;
}

void check(const Shape& sh, at::ScalarType dtype, double tol) {
  at::manual_seed(sh.heads * 131 + sh.head_dim);
  const auto opt = at::TensorOptions().dtype(dtype);
  at::Tensor kt = at::randn({sh.slots, sh.kv_heads, sh.head_dim, sh.capacity}, opt);
  at::Tensor v = at::randn({sh.slots, sh.kv_heads, sh.capacity, sh.head_dim}, opt);
  at::Tensor q = at::randn({sh.rows, sh.heads, sh.head_dim}, opt);
  at::Tensor slots = at::randperm(sh.slots, at::kLong).narrow(0, 0, sh.rows).contiguous();
  at::Tensor pos = at::randint(0, sh.capacity, {sh.rows}, at::kLong);
  pos[0] = 0;                    // one key: the softmax is exactly 1
  pos[sh.rows - 1] = sh.capacity - 1;  // the whole capacity
  at::Tensor out = decode_attention(q, kt, v, slots, pos);
  ASSERT_EQ(out.scalar_type(), dtype);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{sh.rows, sh.heads * sh.head_dim}));
  const at::Tensor ref = reference(q, kt, v, slots, pos);
  EXPECT_LE((out.to(at::kDouble) - ref).abs().max().item<double>(), tol)
      << "H " << sh.heads << " Hkv " << sh.kv_heads << " D " << sh.head_dim << " " << c10::toString(dtype);
  // Row 0 attends to key 0 only: its output is that key's value row, exactly.
  const int64_t rep = sh.heads / sh.kv_heads, s0 = slots[0].item<int64_t>();
  for (int64_t h = 0; h < sh.heads; ++h)
    EXPECT_TRUE(at::equal(out[0].narrow(0, h * sh.head_dim, sh.head_dim), v[s0][h / rep][0]));
}

TEST(DecodeAttention, EqualsAttentionWrittenOutFp32) {
  for (const Shape& sh : {Shape{6, 4, 9, 3, 64, 40}, Shape{5, 5, 4, 4, 24, 17}, Shape{8, 3, 8, 2, 80, 33},
                          Shape{3, 2, 2, 1, 7, 70}})
    check(sh, at::kFloat, 2e-6);
}

TEST(DecodeAttention, EqualsAttentionWrittenOutBf16WithinItsRounding) {
  // Sums are fp32; the output is rounded once to bf16 (relative 2^-8 of values ~1).
  for (const Shape& sh : {Shape{6, 4, 9, 3, 64, 40}, Shape{5, 5, 4, 4, 24, 17}}) check(sh, at::kBFloat16, 1.6e-2);
}

TEST(DecodeAttention, EqualsScaledDotProductAttention) {
  // Every slot one row at its own length: SDPA with the boolean mask key <= position and
  // GQA, on the position-major copy of the keys.
  const int64_t S = 5, H = 6, Hkv = 2, D = 32, cap = 21;
  at::manual_seed(3);
  at::Tensor kt = at::randn({S, Hkv, D, cap}), v = at::randn({S, Hkv, cap, D}), q = at::randn({S, H, D});
  at::Tensor pos = at::tensor({3, 20, 0, 11, 7}, at::kLong), slots = at::arange(S, at::kLong);
  at::Tensor mask = (at::arange(cap, at::kLong).view({1, 1, 1, cap}) <= pos.view({S, 1, 1, 1}));
  at::Tensor sdpa = at::scaled_dot_product_attention(q.unsqueeze(2), kt.transpose(2, 3).contiguous(), v, mask, 0.0,
                                                     false, std::nullopt, /*enable_gqa=*/true);  // [S, H, 1, D]
  at::Tensor out = decode_attention(q, kt, v, slots, pos);
  EXPECT_LE((out - sdpa.reshape({S, H * D})).abs().max().item<double>(), 2e-6);
}

TEST(DecodeAttention, RefusesWhatItCannotRead) {
  at::Tensor kt = at::zeros({2, 1, 8, 4}), v = at::zeros({2, 1, 4, 8}), q = at::zeros({1, 2, 8});
  at::Tensor one = at::zeros({1}, at::kLong);
  EXPECT_THROW(decode_attention(q, kt, v, one, at::full({1}, 4, at::kLong)), c10::Error);  // position >= capacity
  EXPECT_THROW(decode_attention(q, kt, v, at::full({1}, 2, at::kLong), one), c10::Error);  // slot out of range
  EXPECT_THROW(decode_attention(q, v, v, one, one), c10::Error);                           // keys not dimension-major
  EXPECT_THROW(decode_attention(q.to(at::kDouble), kt.to(at::kDouble), v.to(at::kDouble), one, one), c10::Error);
  EXPECT_FALSE(decode_attention_supports(at::kHalf, at::kCPU));
}

TEST(SkinnyLinear, EqualsLinearForEveryTileAndTail) {
  // N: 8-row tiles, then 4, then single rows; K: 16-lane blocks and a tail; M: 4-row tiles and 1..3 tails.
  for (int64_t M : {1, 2, 3, 5, 8})
    for (auto [N, K] : {std::pair<int64_t, int64_t>{13, 37}, {64, 576}, {7, 16}, {45, 5}}) {
      at::manual_seed(M * 1000 + N + K);
      at::Tensor x = at::randn({M, K}), w = at::randn({N, K}), b = at::randn({N});
      const at::Tensor ref = at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));
      const double tol = 1e-6 * static_cast<double>(K);  // fp32 sums of K products of unit-scale terms
      EXPECT_LE((skinny_linear_kernel(x, w, b).to(at::kDouble) - ref).abs().max().item<double>(), tol)
          << M << "x" << K << " by " << N;
      EXPECT_LE((skinny_linear_kernel(x, w, {}).to(at::kDouble) - (ref - b.to(at::kDouble))).abs().max().item<double>(), tol);
    }
}

TEST(SkinnyLinear, LinearForDecodeTakesTheKernelOnlyWhereItIsFaster) {
  at::manual_seed(5);
  at::Tensor w = at::randn({40, 24}), x1 = at::randn({1, 1, 24}), x3 = at::randn({3, 1, 24});
  c10::NoGradGuard no_grad;
  // One row (shape [1, 1, K]): the kernel, bit for bit, shaped like at::linear's result.
  const at::Tensor y1 = linear_for_decode(x1, w, {});
  EXPECT_EQ(y1.sizes(), (std::vector<int64_t>{1, 1, 40}));
  EXPECT_TRUE(at::equal(y1.view({1, 40}), skinny_linear_kernel(x1.view({1, 24}), w, {})));
  // More rows than kSkinnyRows, or another dtype: at::linear itself.
  EXPECT_TRUE(at::equal(linear_for_decode(x3, w, {}), at::linear(x3, w)));
  EXPECT_TRUE(at::equal(linear_for_decode(x1.to(at::kDouble), w.to(at::kDouble), {}), at::linear(x1.to(at::kDouble), w.to(at::kDouble))));
  {
    c10::AutoGradMode grad(true);  // recording autograd: never the kernel
    EXPECT_TRUE(at::equal(linear_for_decode(x1, w, {}), at::linear(x1, w)));
  }
}

}  // namespace
}  // namespace rpg::model
