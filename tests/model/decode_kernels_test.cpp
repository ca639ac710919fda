// The CPU decode kernels. The packed GEMMs (packed_gemm.h: rpg's panel kernel and MKL's)
// against at::linear in fp64 for every row count a decode step can have, the panel kernel's
// independence of the rows beside each row, the staleness check, and decode() with packed
// weights against decode() without on every family; skinny_linear_kernel against at::linear in fp64 (tile and tail
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
#include <malloc.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "model_test_util.h"
#include "test_util.h"
#include "rpg/core/malloc_env.h"
#include "rpg/model/causal_lm.h"
#include "rpg/model/cpu_kernels.h"
#include "rpg/model/decode_attention.h"
#include "rpg/model/decode_elementwise.h"
#include "rpg/model/packed_gemm.h"
#include "rpg/model/skinny_linear.h"

namespace rpg::model {
namespace {

struct Shape {
  int64_t slots, rows, heads, kv_heads, head_dim, capacity;
};

// softmax(q k^T / sqrt(D)) v over keys 0..pos of each row's slot, in fp64 from the same
// (rounded) inputs; head h reads KV head h / (H / Hkv). k: position-major [S, Hkv, capacity, D].
at::Tensor reference(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v, const at::Tensor& slots,
                     const at::Tensor& pos) {
  const int64_t R = q.size(0), H = q.size(1), D = q.size(2), Hkv = v.size(1), rep = H / Hkv;
  at::Tensor out = at::zeros({R, H * D}, at::kDouble);
  for (int64_t r = 0; r < R; ++r) {
    const int64_t s = slots[r].item<int64_t>(), n = pos[r].item<int64_t>() + 1;
    for (int64_t h = 0; h < H; ++h) {
      at::Tensor k = k_cache[s][h / rep].narrow(0, 0, n).to(at::kDouble);  // [n, D]
      at::Tensor vv = v[s][h / rep].narrow(0, 0, n).to(at::kDouble);
      at::Tensor p = at::softmax(at::mv(k, q[r][h].to(at::kDouble)) / std::sqrt(static_cast<double>(D)), 0);
      out[r].narrow(0, h * D, D).copy_(at::mv(vv.t(), p));
    }
  }
  return out;
}

// Every kernel this CPU has (detail::AttentionKernel; each reads fp32 and bf16 caches).
std::vector<detail::AttentionKernel> kernels() {
  std::vector<detail::AttentionKernel> out = {detail::AttentionKernel::kGeneric};
  if (detail::attention_kernel_available(detail::AttentionKernel::kAvx512)) out.push_back(detail::AttentionKernel::kAvx512);
  return out;
}

void check(const Shape& sh, at::ScalarType dtype, double tol,
           detail::AttentionKernel kernel = detail::AttentionKernel::kAuto) {
  at::manual_seed(sh.heads * 131 + sh.head_dim);
  const auto opt = at::TensorOptions().dtype(dtype);
  at::Tensor k = at::randn({sh.slots, sh.kv_heads, sh.capacity, sh.head_dim}, opt), kt = block_keys(k);
  at::Tensor v = at::randn({sh.slots, sh.kv_heads, sh.capacity, sh.head_dim}, opt);
  at::Tensor q = at::randn({sh.rows, sh.heads, sh.head_dim}, opt);
  at::Tensor slots = at::randperm(sh.slots, at::kLong).narrow(0, 0, sh.rows).contiguous();
  at::Tensor pos = at::randint(0, sh.capacity, {sh.rows}, at::kLong);
  pos[0] = 0;                    // one key: the softmax is exactly 1
  pos[sh.rows - 1] = sh.capacity - 1;  // the whole capacity
  at::Tensor out = detail::decode_attention(q, kt, v, slots, pos, {}, kernel);
  ASSERT_EQ(out.scalar_type(), dtype);
  ASSERT_EQ(out.sizes(), (std::vector<int64_t>{sh.rows, sh.heads * sh.head_dim}));
  const at::Tensor ref = reference(q, k, v, slots, pos);
  EXPECT_LE((out.to(at::kDouble) - ref).abs().max().item<double>(), tol)
      << "H " << sh.heads << " Hkv " << sh.kv_heads << " D " << sh.head_dim << " cap " << sh.capacity << " "
      << c10::toString(dtype) << " kernel " << static_cast<int>(kernel);
  // Row 0 attends to key 0 only: its output is that key's value row, exactly.
  const int64_t rep = sh.heads / sh.kv_heads, s0 = slots[0].item<int64_t>();
  for (int64_t h = 0; h < sh.heads; ++h)
    EXPECT_TRUE(at::equal(out[0].narrow(0, h * sh.head_dim, sh.head_dim), v[s0][h / rep][0]));
}

TEST(DecodeAttention, EqualsAttentionWrittenOutFp32) {
  // Query heads per KV head 1..8 (the AVX-512 form takes them 4 at a time), D below, at and
  // past its 64-float chunks and not a multiple of 16, capacities past its 32-key blocks and
  // 64-key tiles with tails; every kernel this CPU has.
  for (auto kernel : kernels())
    for (const Shape& sh : {Shape{6, 4, 9, 3, 64, 40}, Shape{5, 5, 4, 4, 24, 17}, Shape{8, 3, 8, 2, 80, 33},
                            Shape{3, 2, 2, 1, 7, 70}, Shape{4, 4, 14, 2, 64, 300}, Shape{3, 3, 8, 1, 128, 97},
                            Shape{2, 2, 10, 2, 40, 129}, Shape{3, 2, 6, 2, 16, 1}})
      check(sh, at::kFloat, 2e-6, kernel);
}

TEST(DecodeAttention, KernelsAgreeAndRowsDoNotDependOnTheirNeighbours) {
  // Each row's output is computed from its own slot alone: the same bits whether it is decoded
  // alone or beside others; the kernels differ only in how they block the same sums.
  const int64_t S = 4, H = 14, Hkv = 2, D = 64, cap = 200;
  at::Tensor pos = at::tensor({199, 31, 64, 100}, at::kLong), slots = at::tensor({2, 0, 3, 1}, at::kLong);
  for (auto [kernel, dtype] : {std::pair{detail::AttentionKernel::kGeneric, at::kFloat},
                               std::pair{detail::AttentionKernel::kAvx512, at::kFloat},
                               std::pair{detail::AttentionKernel::kGeneric, at::kBFloat16},
                               std::pair{detail::AttentionKernel::kAvx512, at::kBFloat16}}) {
    if (!detail::attention_kernel_available(kernel)) continue;
    at::manual_seed(11);
    const auto opt = at::TensorOptions().dtype(dtype);
    at::Tensor kt = block_keys(at::randn({S, Hkv, cap, D}, opt)), v = at::randn({S, Hkv, cap, D}, opt);
    at::Tensor q = at::randn({S, H, D}, opt);
    at::Tensor all = detail::decode_attention(q, kt, v, slots, pos, {}, kernel);
    for (int64_t r = 0; r < S; ++r) {
      at::Tensor one = detail::decode_attention(q.narrow(0, r, 1), kt, v, slots.narrow(0, r, 1), pos.narrow(0, r, 1),
                                                {}, kernel);
      EXPECT_TRUE(at::equal(one[0], all[r])) << "row " << r << " kernel " << static_cast<int>(kernel);
    }
    // The same FMA chains, blocked differently: the same bits (kAuto's choice is speed only).
    at::Tensor generic = detail::decode_attention(q, kt, v, slots, pos, {}, detail::AttentionKernel::kGeneric);
    EXPECT_TRUE(at::equal(all, generic));
  }
}

TEST(DecodeAttention, ASharedPrefixIsReadFromOneSlotWithTheSameBits) {
  // Slots 1, 3, 4 and 5 hold the same first 37 positions (a prompt copied into the slots of its
  // samples); rows reading them from slot 1 give the bits they give reading their own. Shapes:
  // SmolLM2's heads, Qwen2.5's 7 per KV head (more queries than the AVX-512 form takes at once),
  // a head dim that is not a multiple of its 32 columns, one query head per KV head.
  const int64_t S = 7, cap = 128, P = 37;
  for (auto [H, Hkv, D] : {std::array<int64_t, 3>{9, 3, 64}, {14, 2, 40}, {4, 4, 16}})
    for (auto dtype : {at::kFloat, at::kBFloat16}) {
      at::manual_seed(5);
      const auto opt = at::TensorOptions().dtype(dtype);
      at::Tensor k = at::randn({S, Hkv, cap, D}, opt), v = at::randn({S, Hkv, cap, D}, opt), q = at::randn({6, H, D}, opt);
      for (int64_t s : {3, 4, 5}) {
        k[s].narrow(1, 0, P).copy_(k[1].narrow(1, 0, P));
        v[s].narrow(1, 0, P).copy_(v[1].narrow(1, 0, P));
      }
      const at::Tensor kt = block_keys(k);
      const at::Tensor slots = at::tensor({4, 1, 0, 3, 2, 5}, at::kLong), pos = at::tensor({50, 36, 20, 99, 127, 36}, at::kLong);
      const SharedPrefix prefix{at::tensor({1, 1, 0, 1, 2, 1}, at::kLong),
                                at::tensor(std::vector<int64_t>{P, P, 0, 30, 128, P}, at::kLong)};
      for (auto kernel : kernels()) {
        const std::string what = c10::str(c10::toString(dtype), " kernel ", static_cast<int>(kernel), " H ", H, " Hkv ", Hkv, " D ", D);
        const at::Tensor own = detail::decode_attention(q, kt, v, slots, pos, {}, kernel);
        EXPECT_TRUE(at::equal(detail::decode_attention(q, kt, v, slots, pos, prefix, kernel), own)) << what;
        // It is read from there: a prefix slot holding other keys changes the rows that use it.
        const SharedPrefix elsewhere{at::tensor({6, 1, 0, 6, 2, 1}, at::kLong), prefix.lengths};
        const at::Tensor wrong = detail::decode_attention(q, kt, v, slots, pos, elsewhere, kernel);
        EXPECT_FALSE(at::equal(wrong[0], own[0])) << what;
        EXPECT_FALSE(at::equal(wrong[3], own[3])) << what;
        EXPECT_TRUE(at::equal(wrong[1], own[1])) << what;
        EXPECT_TRUE(at::equal(wrong[5], own[5])) << what;
      }
    }
  at::Tensor kt = block_keys(at::zeros({2, 1, 8, 4})), v = at::zeros({2, 1, 8, 4}), q = at::zeros({1, 1, 4});
  const at::Tensor zero = at::zeros({1}, at::kLong), three = at::full({1}, 3, at::kLong);
  EXPECT_THROW(decode_attention(q, kt, v, zero, three, {zero, at::full({1}, 5, at::kLong)}), c10::Error);  // past its keys
  EXPECT_THROW(decode_attention(q, kt, v, zero, three, {at::full({1}, 2, at::kLong), three}), c10::Error);  // no such slot
  EXPECT_THROW(decode_attention(q, kt, v, zero, three, {zero, {}}), c10::Error);  // slots without lengths
}

// RPG_DECODE_ATTENTION=sdpa (CTest's model_decode.sdpa and rollout_decode.sdpa run the decode
// tests so) sends decode down the device-generic path a GPU takes: position-major caches and
// SDPA under a mask, no CPU kernel. Without it a CPU fp32 / bf16 cache keeps blocked keys.
TEST(DecodePath, RpgDecodeAttentionSdpaTakesTheDevicePath) {
  const char* env = std::getenv("RPG_DECODE_ATTENTION");
  const bool sdpa = env && std::string(env) == "sdpa";
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16})
    EXPECT_EQ(decode_attention_supports(dtype, at::kCPU), !sdpa) << dtype;
  CausalLM m = test::random_model("qwen2", at::kFloat);
  const ModelConfig& c = m.config();
  const int64_t per_position = c.num_hidden_layers * c.num_key_value_heads * c.head_dim * 4;
  EXPECT_EQ(m.kv_cache_bytes_per_sequence(40), per_position * (40 + (sdpa ? 40 : 64)));
}

// Random RoPE tables for R rows in rope_tables' form: cos [R, 1, 1, D] = [cos f, cos f],
// sin = [-sin f, sin f] (the sign of rotate_half folded in).
std::pair<at::Tensor, at::Tensor> random_rope_tables(int64_t R, int64_t D, at::ScalarType dtype) {
  const at::Tensor f = at::randn({R, 1, 1, D / 2}) * 10;
  return {at::cat({f.cos(), f.cos()}, -1).to(dtype), at::cat({-f.sin(), f.sin()}, -1).to(dtype)};
}

TEST(DecodeAttention, ANewTokenRotatedWrittenAndAttendedInOnePassEqualsTheSeparateOps) {
  // decode_attention with fresh tokens against the ops it replaces: rope_rows on the queries
  // and keys, the keys and values put at their positions with index_put_ on position-major
  // caches (then blocked), and decode_attention on the rotated queries. The same bits in the
  // output and in both caches. Positions in the first block, on block edges and in the last
  // (partial) one; rows on their own slots and rows reading a prompt from another slot (4
  // of them: the AVX-512 form's chunk); shapes as in the shared-prefix test.
  at::NoGradGuard no_grad;  // rope_rows is decode's (decode_elementwise.h)
  const int64_t S = 7, cap = 71, P = 29, R = 6;
  for (auto [H, Hkv, D] : {std::array<int64_t, 3>{9, 3, 64}, {14, 2, 40}, {4, 4, 16}})
    for (auto dtype : {at::kFloat, at::kBFloat16})
      for (bool shared : {false, true}) {
        at::manual_seed(17);
        const auto opt = at::TensorOptions().dtype(dtype);
        at::Tensor k = at::randn({S, Hkv, cap, D}, opt), v = at::randn({S, Hkv, cap, D}, opt);
        for (int64_t s : {3, 4, 5}) {
          k[s].narrow(1, 0, P).copy_(k[1].narrow(1, 0, P));
          v[s].narrow(1, 0, P).copy_(v[1].narrow(1, 0, P));
        }
        const at::Tensor q = at::randn({R, H, D}, opt), k_new = at::randn({R, Hkv, D}, opt),
                         v_new = at::randn({R, Hkv, D}, opt);
        const auto [cos, sin] = random_rope_tables(R, D, dtype);
        const at::Tensor slots = at::tensor({4, 1, 0, 3, 2, 5}, at::kLong),
                         pos = at::tensor({63, 31, 0, 32, 70, 64}, at::kLong);
        const SharedPrefix prefix =
            shared ? SharedPrefix{at::tensor({1, 1, 0, 1, 2, 1}, at::kLong),
                                  at::tensor(std::vector<int64_t>{P, P, 0, 20, 0, P}, at::kLong)}
                   : SharedPrefix{};
        // The separate ops.
        const at::Tensor q_rot = detail::rope_rows(q.view({R, 1, H, D}), cos, sin).view({R, H, D});
        const at::Tensor k_rot = detail::rope_rows(k_new.view({R, 1, Hkv, D}), cos, sin);
        at::Tensor k_ref = k.clone(), v_ref = v.clone();
        k_ref.transpose(1, 2).index_put_({slots.unsqueeze(1), pos.unsqueeze(1)}, k_rot);
        v_ref.transpose(1, 2).index_put_({slots.unsqueeze(1), pos.unsqueeze(1)}, v_new.view({R, 1, Hkv, D}));
        const at::Tensor kt_ref = block_keys(k_ref);
        for (auto kernel : kernels()) {
          const std::string what = c10::str(c10::toString(dtype), " kernel ", static_cast<int>(kernel), " H ", H,
                                            " Hkv ", Hkv, " D ", D, " shared ", shared);
          const at::Tensor expected = detail::decode_attention(q_rot, kt_ref, v_ref, slots, pos, prefix, kernel);
          at::Tensor kt = block_keys(k), vc = v.clone();
          const at::Tensor out =
              detail::decode_attention(q, kt, vc, slots, pos, prefix, kernel, NewTokens{k_new, v_new, cos, sin});
          EXPECT_TRUE(at::equal(out, expected)) << what;
          EXPECT_TRUE(at::equal(kt, kt_ref)) << what;
          EXPECT_TRUE(at::equal(vc, v_ref)) << what;
        }
      }
}

TEST(DecodeAttention, RefusesFreshTokensItWouldRaceOn) {
  // Fresh tokens are written while other rows read: a slot twice, or a prefix read reaching the
  // position another row writes, would be a race; tables or tokens of the wrong size a misread.
  const int64_t S = 3, Hkv = 1, D = 8, cap = 8;
  at::Tensor kt = block_keys(at::zeros({S, Hkv, cap, D})), v = at::zeros({S, Hkv, cap, D});
  const at::Tensor q = at::zeros({2, 2, D}), kv = at::zeros({2, Hkv, D});
  const auto [cos, sin] = random_rope_tables(2, D, at::kFloat);
  const NewTokens fresh{kv, kv, cos, sin};
  const at::Tensor pos = at::tensor({4, 5}, at::kLong);
  EXPECT_NO_THROW(decode_attention(q, kt, v, at::tensor({0, 1}, at::kLong), pos, {}, fresh));
  EXPECT_THROW(decode_attention(q, kt, v, at::tensor({1, 1}, at::kLong), pos, {}, fresh), c10::Error);
  // Row 1 reads 5 keys of slot 0, whose row writes position 4.
  const SharedPrefix reaching{at::tensor({0, 0}, at::kLong), at::tensor({0, 5}, at::kLong)};
  EXPECT_THROW(decode_attention(q, kt, v, at::tensor({0, 1}, at::kLong), pos, reaching, fresh), c10::Error);
  const SharedPrefix before{at::tensor({0, 0}, at::kLong), at::tensor({0, 4}, at::kLong)};
  EXPECT_NO_THROW(decode_attention(q, kt, v, at::tensor({0, 1}, at::kLong), pos, before, fresh));
  EXPECT_THROW(decode_attention(q, kt, v, at::tensor({0, 1}, at::kLong), pos, {},
                                NewTokens{kv, kv, cos.narrow(0, 0, 1), sin}),
               c10::Error);
  EXPECT_THROW(decode_attention(q, kt, v, at::tensor({0, 1}, at::kLong), pos, {}, NewTokens{kv, {}, cos, sin}),
               c10::Error);
}

TEST(DecodeAttention, PrefillWritesBlockedKeysAsIndexPut) {
  // The prefill's path (several positions per row, index_put_ on the blocked cache), read back
  // position-major; positions on both sides of block edges.
  const int64_t S = 5, Hkv = 3, D = 40, cap = 71;
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(7);
    const auto opt = at::TensorOptions().dtype(dtype);
    at::Tensor k = at::randn({S, Hkv, cap, D}, opt);
    at::Tensor kt2 = block_keys(k);
    const at::Tensor rows = at::tensor({1, 4}, at::kLong).unsqueeze(1), at_pos = at::tensor({30, 31, 32, 33, 66, 67, 68, 69}, at::kLong).view({2, 4});
    const at::Tensor k_put = at::randn({2, 4, Hkv, D}, opt);
    put_blocked_keys(kt2, rows, key_places(at_pos), k_put);
    at::Tensor k_ref2 = k.clone();
    k_ref2.transpose(1, 2).index_put_({rows, at_pos}, k_put);
    EXPECT_TRUE(at::equal(kt2, block_keys(k_ref2))) << c10::toString(dtype);
    for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{32}, int64_t{33}, cap})
      EXPECT_TRUE(at::equal(unblock_keys(kt2, n), k_ref2.narrow(2, 0, n))) << n;
  }
}

TEST(DecodeAttention, EqualsAttentionWrittenOutBf16WithinItsRounding) {
  // Sums are fp32; the output is rounded once to bf16 (relative 2^-8 of values ~1). Every
  // kernel, on the fp32 test's shapes (D not a multiple of 16, partial blocks and tiles).
  for (auto kernel : kernels())
    for (const Shape& sh : {Shape{6, 4, 9, 3, 64, 40}, Shape{5, 5, 4, 4, 24, 17}, Shape{8, 3, 8, 2, 80, 33},
                            Shape{3, 2, 2, 1, 7, 70}, Shape{4, 4, 14, 2, 64, 300}, Shape{3, 3, 8, 1, 128, 97},
                            Shape{2, 2, 10, 2, 40, 129}})
      check(sh, at::kBFloat16, 1.6e-2, kernel);
}

TEST(DecodeAttention, EqualsScaledDotProductAttention) {
  // Every slot one row at its own length: SDPA with the boolean mask key <= position and
  // GQA, on the position-major copy of the keys.
  const int64_t S = 5, H = 6, Hkv = 2, D = 32, cap = 21;
  at::manual_seed(3);
  at::Tensor k = at::randn({S, Hkv, cap, D}), v = at::randn({S, Hkv, cap, D}), q = at::randn({S, H, D});
  at::Tensor pos = at::tensor({3, 20, 0, 11, 7}, at::kLong), slots = at::arange(S, at::kLong);
  at::Tensor mask = (at::arange(cap, at::kLong).view({1, 1, 1, cap}) <= pos.view({S, 1, 1, 1}));
  at::Tensor sdpa = at::scaled_dot_product_attention(q.unsqueeze(2), k, v, mask, 0.0,
                                                     false, std::nullopt, /*enable_gqa=*/true);  // [S, H, 1, D]
  at::Tensor out = decode_attention(q, block_keys(k), v, slots, pos);
  EXPECT_LE((out - sdpa.reshape({S, H * D})).abs().max().item<double>(), 2e-6);
}

TEST(DecodeAttention, RefusesWhatItCannotRead) {
  at::Tensor kt = block_keys(at::zeros({2, 1, 4, 8})), v = at::zeros({2, 1, 4, 8}), q = at::zeros({1, 2, 8});
  at::Tensor one = at::zeros({1}, at::kLong);
  EXPECT_THROW(decode_attention(q, kt, v, one, at::full({1}, 4, at::kLong)), c10::Error);  // position >= capacity
  EXPECT_THROW(decode_attention(q, kt, v, at::full({1}, 2, at::kLong), one), c10::Error);  // slot out of range
  EXPECT_THROW(decode_attention(q, v, v, one, one), c10::Error);                           // keys not blocked
  EXPECT_THROW(decode_attention(q, kt.transpose(3, 4), v, one, one), c10::Error);          // blocks the wrong way
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

// The backends this CPU can run: rpg's panel kernel wherever there are AVX2 and FMA (and then
// it is the one chosen), MKL's packed GEMM where libtorch carries MKL (the x86-64 wheels do)
// and its self-check passed on this CPU.
std::vector<detail::PackedBackend> usable_backends() {
  std::vector<detail::PackedBackend> out;
  for (auto b : {detail::PackedBackend::kPanels512, detail::PackedBackend::kPanels, detail::PackedBackend::kMkl})
    if (detail::packed_backend_usable(b)) out.push_back(b);
  return out;
}

// Under model_kernels.haswell (tests/model/CMakeLists.txt) the emulated CPU must be the one
// that test is for: AVX2 and FMA (x86-64-v3), no AVX-512, so that the vectorised loops run
// their x86-64-v3 builds and the packed products the AVX2 panel kernel. Elsewhere (no
// RPG_TEST_EXPECT_CPU) there is nothing to check.
TEST(CpuClones, TheEmulatedCpuIsTheOneAsked) {
  const char* want = std::getenv("RPG_TEST_EXPECT_CPU");
  if (!want) return;
  ASSERT_EQ(std::string(want), "x86-64-v3");
  __builtin_cpu_init();
  EXPECT_TRUE(__builtin_cpu_supports("x86-64-v3"));
  EXPECT_FALSE(__builtin_cpu_supports("avx512f"));
  EXPECT_EQ(detail::packed_backend(), detail::PackedBackend::kPanels);
  EXPECT_FALSE(detail::attention_kernel_available(detail::AttentionKernel::kAvx512));
}

TEST(PackedGemm, ChoosesThePanelKernelWhereTheCpuHasAvx2AndFma) {
  const bool avx512 = __builtin_cpu_supports("avx512f");
  const bool avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  EXPECT_EQ(detail::packed_backend_usable(detail::PackedBackend::kPanels512), avx512);
  EXPECT_EQ(detail::packed_backend_usable(detail::PackedBackend::kPanels), avx2_fma);
  EXPECT_EQ(detail::packed_backend_usable(detail::PackedBackend::kMkl), at::hasMKL());  // false: its check failed
  EXPECT_EQ(detail::packed_backend(), avx512        ? detail::PackedBackend::kPanels512
                                      : avx2_fma     ? detail::PackedBackend::kPanels
                                      : at::hasMKL() ? detail::PackedBackend::kMkl
                                                     : detail::PackedBackend::kNone);
  EXPECT_EQ(detail::packed_gemm_available(), avx512 || avx2_fma || at::hasMKL());
  EXPECT_FALSE(detail::PackedWeight::pack(at::randn({4, 4}), detail::PackedBackend::kNone).defined());
}

TEST(PackedGemm, EqualsLinearForEveryRowCountWithAndWithoutBias) {
  const auto backends = usable_backends();
  if (backends.empty()) GTEST_FAIL() << "no packed GEMM on this CPU (see ChoosesThePanelKernelWhereTheCpuHasAvx2AndFma)";
  for (auto backend : backends) {
    SCOPED_TRACE(detail::packed_backend_name(backend));
    // One packing serves every row count: 1 (where MKL ignores beta, see PackedWeight::linear),
    // the tails around the blocks (the panel kernel's 4 rows and 24 columns, MKL's own), and up
    // to kPackedMaxRows.
    for (auto [N, K] : {std::pair<int64_t, int64_t>{40, 24}, {37, 29}, {192, 96}, {7, 130}, {49, 576}}) {
      at::manual_seed(N * 31 + K);
      const at::Tensor w = at::randn({N, K}), b = at::randn({N});
      const detail::PackedWeight p = detail::PackedWeight::pack(w, backend);
      ASSERT_TRUE(p.defined() && p.current() && p.backend() == backend);
      for (int64_t M : std::vector<int64_t>{1, 2, 3, 5, 8, 15, 16, 17, 63, 64, 65, 200, detail::kPackedMaxRows}) {
        const at::Tensor x = at::randn({M, 1, K});
        const at::Tensor ref = at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));
        const double tol = 1e-6 * static_cast<double>(K);  // fp32 sums of K products of unit-scale terms
        const at::Tensor y = p.linear(x, b);
        ASSERT_EQ(y.sizes(), (std::vector<int64_t>{M, 1, N}));
        EXPECT_LE((y.to(at::kDouble) - ref).abs().max().item<double>(), tol) << M << "x" << K << " by " << N;
        EXPECT_LE((p.linear(x, {}).to(at::kDouble) - (ref - b.to(at::kDouble))).abs().max().item<double>(), tol)
            << M << "x" << K << " by " << N << " without bias";
      }
    }
  }
}

// The panel kernels (AVX2, and AVX-512 where the CPU has it) compute each output as one FMA
// chain over K in order, whatever the rows around it and the threads: a row multiplied alone
// and inside batches of 2-13 rows (every position in the 4- and 8-row tiles and their tails)
// comes out bit for bit the same; and on inputs whose partial sums are all exact (multiples of
// 1/8 in [-1, 1]) it equals the exact product, in the columns of full panels and of the last,
// partial one (N = 53 = 2 x 24 + 5 = 32 + 21).
TEST(PackedGemm, PanelRowsDoNotDependOnTheRowsBesideThem) {
  if (!detail::packed_backend_usable(detail::PackedBackend::kPanels)) GTEST_FAIL() << "no AVX2/FMA on this CPU";
  auto grid = [](int64_t count, int64_t salt) {
    return at::arange(count, at::kLong).mul_(7).add_(salt).remainder_(17).sub_(8).to(at::kFloat).div_(8);
  };
  const int64_t N = 53, K = 45;
  const at::Tensor w = grid(N * K, 3).view({N, K});
  for (auto backend : {detail::PackedBackend::kPanels, detail::PackedBackend::kPanels512}) {
    if (!detail::packed_backend_usable(backend)) continue;  // AVX-512: where the CPU has it
    SCOPED_TRACE(detail::packed_backend_name(backend));
    const detail::PackedWeight p = detail::PackedWeight::pack(w, backend);
    ASSERT_TRUE(p.defined());
    const at::Tensor xg = grid(13 * K, 5).view({13, K});
    EXPECT_TRUE(at::equal(p.linear(xg, {}), at::mm(xg.to(at::kDouble), w.to(at::kDouble).t()).to(at::kFloat)));
    at::manual_seed(8);
    const at::Tensor x = at::randn({13, K});
    std::vector<at::Tensor> alone;
    for (int64_t r = 0; r < 13; ++r) alone.push_back(p.linear(x.narrow(0, r, 1), {}));
    for (int64_t M = 2; M <= 13; ++M) {
      const at::Tensor y = p.linear(x.narrow(0, 0, M), {});
      for (int64_t r = 0; r < M; ++r) EXPECT_TRUE(at::equal(y.narrow(0, r, 1), alone[r])) << "row " << r << " of " << M;
    }
  }
}

// The fp32 panel kernels' contract, at the sizes where a panel is read by several row tiles and
// K is taken in blocks (for_each_tile in packed_gemm.cpp): each output is x[i] . w[c] summed as
// one FMA chain over k in order from zero, then + bias[c] (one rounding), then residual + that,
// bit for bit. The chain is computed here with std::fma. K below, at and across the blocks
// (128 values for AVX-512, 256 for AVX2) with a remainder; M from one tile to more than a group
// of them (64 rows), with partial tiles.
TEST(PackedGemm, Fp32PanelsAreOneFmaChainOverKInOrder) {
  if (!detail::packed_backend_usable(detail::PackedBackend::kPanels)) GTEST_FAIL() << "no AVX2/FMA on this CPU";
  for (auto backend : {detail::PackedBackend::kPanels, detail::PackedBackend::kPanels512}) {
    if (!detail::packed_backend_usable(backend)) continue;  // AVX-512: where the CPU has it
    SCOPED_TRACE(detail::packed_backend_name(backend));
    for (auto [N, K] : {std::pair<int64_t, int64_t>{37, 45}, {70, 128}, {33, 300}, {7, 576}, {40, 1000}}) {
      at::manual_seed(N * 7 + K);
      const at::Tensor w = at::randn({N, K}), b = at::randn({N});
      const detail::PackedWeight p = detail::PackedWeight::pack(w, backend);
      ASSERT_TRUE(p.defined());
      for (int64_t M : {1, 5, 8, 9, 16, 31, 40, 64, 65, 130}) {
        const at::Tensor x = at::randn({M, K}), residual = at::randn({M, N});
        at::Tensor chain = at::empty({M, N}), with_bias = at::empty({M, N}), with_residual = at::empty({M, N});
        const auto xa = x.accessor<float, 2>(), wa = w.accessor<float, 2>(), ra = residual.accessor<float, 2>();
        const auto ba = b.accessor<float, 1>();
        auto ca = chain.accessor<float, 2>(), cb = with_bias.accessor<float, 2>(), cr = with_residual.accessor<float, 2>();
        for (int64_t i = 0; i < M; ++i)
          for (int64_t c = 0; c < N; ++c) {
            float sum = 0;
            for (int64_t k = 0; k < K; ++k) sum = std::fma(xa[i][k], wa[c][k], sum);
            ca[i][c] = sum;
            cb[i][c] = sum + ba[c];
            cr[i][c] = ra[i][c] + cb[i][c];
          }
        EXPECT_TRUE(at::equal(p.linear(x, {}), chain)) << M << " x " << K << " by " << N;
        EXPECT_TRUE(at::equal(p.linear(x, b), with_bias)) << M << " x " << K << " by " << N;
        EXPECT_TRUE(at::equal(p.linear(x, b, residual), with_residual)) << M << " x " << K << " by " << N;
      }
    }
  }
}

// The fused forms a decode layer uses (layer.cpp): gate, up and SwiGLU in one pass
// (swiglu_linear), and o_proj / down_proj adding the residual as they store (linear with a
// residual). Both give the same bits as the unfused forms they replace (two products and
// swiglu_rows; a product, then residual + it), for every panel kernel the CPU has, at row
// counts around the 4- and 8-row tiles and widths around the 24- and 32-column panels; and
// the SwiGLU equals silu(x G^T) * (x U^T) in fp64. Where it cannot run it says so (undefined),
// and a residual of the wrong shape is refused.
TEST(PackedGemm, FusedSwigluAndResidualEqualTheUnfusedFormsBitForBit) {
  c10::NoGradGuard no_grad;  // as decode runs
  const auto backends = usable_backends();
  if (backends.empty()) GTEST_FAIL() << "no packed GEMM on this CPU (see ChoosesThePanelKernelWhereTheCpuHasAvx2AndFma)";
  for (auto backend : backends) {
    SCOPED_TRACE(detail::packed_backend_name(backend));
    const bool panels = backend != detail::PackedBackend::kMkl;
    for (auto [N, K] : {std::pair<int64_t, int64_t>{53, 45}, {80, 64}, {37, 29}, {96, 130}, {24, 8}, {40, 300}}) {
      at::manual_seed(N * 17 + K);
      const at::Tensor gw = at::randn({N, K}), uw = at::randn({N, K}), b = at::randn({N});
      const detail::PackedWeight g = detail::PackedWeight::pack(gw, backend), u = detail::PackedWeight::pack(uw, backend);
      ASSERT_TRUE(g.defined() && u.defined());
      for (int64_t M : {1, 2, 3, 5, 8, 9, 13, 64}) {
        const at::Tensor x = at::randn({M, 1, K}) * 2, residual = at::randn({M, 1, N});
        EXPECT_TRUE(at::equal(g.linear(x, {}, residual), residual + g.linear(x, {}))) << M << " x " << N;
        EXPECT_TRUE(at::equal(g.linear(x, b, residual), residual + g.linear(x, b))) << M << " x " << N;
        const at::Tensor act = detail::swiglu_linear(g, u, x);
        if (!panels) {
          EXPECT_FALSE(act.defined()) << "swiglu_linear is the panel kernels' only";
          continue;
        }
        ASSERT_TRUE(act.defined());
        ASSERT_EQ(act.sizes(), (std::vector<int64_t>{M, 1, N}));
        EXPECT_TRUE(at::equal(act, detail::swiglu_rows(g.linear(x, {}), u.linear(x, {})))) << M << " x " << N;
        // fp64, within the fp32 sums' error bound: K eps sum_k |x_k w_k| for each product, carried
        // through silu(g) u (|silu'| < 1.1), plus the result's own rounding.
        const at::Tensor xd = x.to(at::kDouble), gd = at::linear(xd, gw.to(at::kDouble)),
                         ud = at::linear(xd, uw.to(at::kDouble));
        const at::Tensor want = gd * at::sigmoid(gd) * ud;
        const double eps = static_cast<double>(K) * 6e-8;
        const at::Tensor eg = at::linear(xd.abs(), gw.to(at::kDouble).abs()) * eps,
                         eu = at::linear(xd.abs(), uw.to(at::kDouble).abs()) * eps;
        const at::Tensor bound = 1.1 * eg * ud.abs() + (gd.abs() + 1) * eu + 1e-6 * want.abs() + 1e-30;
        EXPECT_TRUE(((act.to(at::kDouble) - want).abs() <= bound).all().item<bool>()) << M << " x " << N;
      }
      EXPECT_FALSE(detail::swiglu_linear(g, detail::PackedWeight::pack(at::randn({N, K + 1}), backend),
                                         at::randn({2, K}))
                       .defined())
          << "gate and up of different shapes";
      EXPECT_THROW(g.linear(at::randn({2, K}), {}, at::randn({2, N + 1})), c10::Error);
    }
  }
  at::Tensor gw = at::randn({32, 16}), uw = at::randn({32, 16});
  const detail::PackedWeight g = detail::PackedWeight::pack(gw), u = detail::PackedWeight::pack(uw);
  if (!g.defined()) GTEST_FAIL() << "no packed GEMM in this libtorch";
  gw.mul_(2);  // stale: never multiplied
  EXPECT_FALSE(detail::swiglu_linear(g, u, at::randn({2, 16})).defined());
}

// A decode layer's q, k and v in one parallel region (linear_together): each result has the bits
// of its own product (linear, with or without a bias), for every backend with panels, fp32 and
// bf16, at row counts around the tiles and widths around the panels (a last panel partly full
// in each product, so a product's panels never run into the next one's); refused (empty) where
// it cannot run.
TEST(PackedGemm, ProductsTogetherEqualEachProductBitForBit) {
  c10::NoGradGuard no_grad;  // as decode runs
  std::vector<std::pair<detail::PackedBackend, at::ScalarType>> kinds;
  for (auto backend : usable_backends()) kinds.push_back({backend, at::kFloat});
  for (auto backend : {detail::PackedBackend::kPanelsBf16, detail::PackedBackend::kAmxBf16})
    if (detail::packed_backend_usable(backend)) kinds.push_back({backend, at::kBFloat16});
  if (kinds.empty()) GTEST_FAIL() << "no packed GEMM on this CPU (see ChoosesThePanelKernelWhereTheCpuHasAvx2AndFma)";
  for (auto [backend, dtype] : kinds) {
    SCOPED_TRACE(detail::packed_backend_name(backend));
    const bool panels = backend != detail::PackedBackend::kMkl;
    for (auto [K, widths] : {std::pair<int64_t, std::vector<int64_t>>{45, {53, 37, 24}},
                             {64, {576, 192, 192}},
                             {130, {8, 33, 70}},
                             {29, {96}}}) {
      at::manual_seed(K);
      std::vector<at::Tensor> ws, bs;
      std::vector<detail::PackedWeight> packed;
      for (int64_t n : widths) {
        ws.push_back(at::randn({n, K}).to(dtype));
        bs.push_back(at::randn({n}).to(dtype));
        packed.push_back(detail::PackedWeight::pack(ws.back(), backend));
        ASSERT_TRUE(packed.back().defined());
      }
      std::vector<const detail::PackedWeight*> ptrs;
      for (const auto& p : packed) ptrs.push_back(&p);
      for (int64_t M : {1, 2, 3, 5, 8, 9, 13, 17, 64}) {
        const at::Tensor x = at::randn({M, 1, K}).to(dtype);
        for (bool with_bias : {false, true}) {
          std::vector<at::Tensor> biases = bs;
          if (!with_bias) biases.assign(bs.size(), at::Tensor());
          if (with_bias && biases.size() > 1) biases[1] = at::Tensor();  // k without a bias, as a mix
          const std::vector<at::Tensor> together = detail::linear_together(ptrs, x, biases);
          if (!panels) {
            EXPECT_TRUE(together.empty()) << "linear_together is the panel kernels' only";
            continue;
          }
          ASSERT_EQ(together.size(), widths.size());
          for (size_t j = 0; j < widths.size(); ++j) {
            ASSERT_EQ(together[j].sizes(), (std::vector<int64_t>{M, 1, widths[j]}));
            EXPECT_TRUE(at::equal(together[j], packed[j].linear(x, biases[j])))
                << "product " << j << " of " << M << " rows x " << K << " -> " << widths[j]
                << (with_bias ? " with bias" : "");
          }
        }
      }
      // Refused: another K, a bias of another length, x of another width or dtype.
      const detail::PackedWeight other = detail::PackedWeight::pack(at::randn({16, K + 1}).to(dtype), backend);
      const at::Tensor x = at::randn({2, K}).to(dtype);
      EXPECT_TRUE(detail::linear_together({ptrs[0], &other}, x, {{}, {}}).empty());
      EXPECT_TRUE(detail::linear_together({ptrs[0]}, x, {at::randn({widths[0] + 1}).to(dtype)}).empty());
      EXPECT_TRUE(detail::linear_together({ptrs[0]}, at::randn({2, K + 1}).to(dtype), {{}}).empty());
      EXPECT_TRUE(detail::linear_together({ptrs[0]}, x.to(dtype == at::kFloat ? at::kDouble : at::kFloat), {{}}).empty());
      EXPECT_TRUE(detail::linear_together({ptrs[0]}, x, {}).empty());
    }
  }
  // A stale weight (changed in place since it was packed) is never multiplied.
  at::Tensor qw = at::randn({32, 16}), kw = at::randn({8, 16});
  const detail::PackedWeight q = detail::PackedWeight::pack(qw), k = detail::PackedWeight::pack(kw);
  if (!q.defined()) GTEST_FAIL() << "no packed GEMM in this libtorch";
  kw.mul_(2);
  EXPECT_TRUE(detail::linear_together({&q, &k}, at::randn({2, 16}), {{}, {}}).empty());
}

TEST(PackedGemm, PacksOnlyWhatItCanMultiplyAndNeverAStaleWeight) {
  at::Tensor w = at::randn({16, 8});
  // bf16 only where the bf16 panel kernel runs (PackedGemm.Bf16PanelsRound...); fp16 nowhere.
  EXPECT_EQ(detail::PackedWeight::pack(w.to(at::kBFloat16)).defined(), detail::cpu_has_avx512_bf16());
  EXPECT_FALSE(detail::PackedWeight::pack(w.to(at::kHalf)).defined());
  EXPECT_FALSE(detail::PackedWeight::pack(w.t()).defined());  // not contiguous
  EXPECT_FALSE(detail::PackedWeight::pack(w.t().contiguous().t().to(at::kBFloat16)).defined());
  EXPECT_FALSE(detail::PackedWeight::pack(at::randn({16})).defined());
  detail::PackedWeights packs;
  packs.add(w);
  packs.add(w);  // once per tensor
  ASSERT_EQ(packs.size(), detail::packed_gemm_available() ? 1u : 0u);
  if (packs.size() == 0) GTEST_FAIL() << "no packed GEMM in this libtorch";
  ASSERT_NE(packs.find(w), nullptr);
  EXPECT_EQ(packs.find(at::randn({16, 8})), nullptr);
  w.mul_(2);  // an optimizer step in place: the packing is stale and no longer found
  EXPECT_EQ(packs.find(w), nullptr);
}

// rpg-torch's heap keeps freed memory (core/malloc_env.h). A packing that finds room there
// reuses it and leaves its pages for the next tensors; one that had to extend the heap --
// MKL asks for up to 4x the weight and writes about 1x -- gives its pages back when it goes,
// so that they do not stay resident under the tensors that come after. Residency is read
// from the page tables (test::resident_anonymous_kib).
void packings_reuse_the_heap() {
  malloc_env::keep_freed_memory();
  ASSERT_TRUE(detail::packed_gemm_available());
  const at::Tensor w = at::randn({2048, 2048});  // 16 MiB
  {
    ASSERT_LT(mallinfo2().fordblks, 16u << 20) << "the heap has room: this case would not extend it";
    const size_t heap_before = mallinfo2().arena;
    const long long rss_before = rpg::test::resident_anonymous_kib();
    {
      const detail::PackedWeight packed = detail::PackedWeight::pack(w);
      ASSERT_TRUE(packed.defined());
      EXPECT_GT(mallinfo2().arena, heap_before + (16u << 20)) << "the packing did not come from the heap";
      EXPECT_GT(rpg::test::resident_anonymous_kib(), rss_before + 15 * 1024) << "the packing wrote less than the weight";
    }
    EXPECT_LT(rpg::test::resident_anonymous_kib(), rss_before + 1024) << "the packing extended the heap and its pages stayed resident";
  }
  {
    void* room = std::malloc(96u << 20);  // resident free memory in the heap, as an update leaves
    rpg::test::touch_bytes(room, 96u << 20);
    std::free(room);
    ASSERT_GE(mallinfo2().fordblks, 96u << 20);
    const size_t heap_before = mallinfo2().arena;
    long long rss_with = 0;
    {
      const detail::PackedWeight packed = detail::PackedWeight::pack(w);
      ASSERT_TRUE(packed.defined());
      EXPECT_EQ(mallinfo2().arena, heap_before) << "the packing did not reuse the heap's free memory";
      rss_with = rpg::test::resident_anonymous_kib();
    }
    EXPECT_GT(rpg::test::resident_anonymous_kib(), rss_with - 1024) << "memory the heap had kept was handed back";
  }
}

// Ends a death-test child: its failures onto the stderr its parent shows, exit status 1 if any.
[[noreturn]] void exit_with_the_tests_failures() {
  const testing::TestResult* r = testing::UnitTest::GetInstance()->current_test_info()->result();
  for (int i = 0; i < r->total_part_count(); ++i)
    if (const testing::TestPartResult& p = r->GetTestPartResult(i); p.failed())
      std::fprintf(stderr, "%s:%d: %s\n", p.file_name() ? p.file_name() : "?", p.line_number(), p.message());
  std::exit(testing::Test::HasFailure() ? 1 : 0);
}

// The heap's state is the case's precondition, so it runs in a fresh process: gtest's
// "threadsafe" death-test style re-executes this binary for this test alone (run as part of
// the whole binary, the tests before it leave free memory in the heap).
TEST(PackedGemm, BuffersReuseTheHeapAndGiveBackOnlyWhatTheyAddedToIt) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        packings_reuse_the_heap();
        exit_with_the_tests_failures();
      },
      testing::ExitedWithCode(0), "");
}

TEST(PackedGemm, DecodeWithPackedWeightsEqualsDecodeWithout) {
  for (const char* family : {"qwen2", "qwen3", "llama"}) {
    CausalLM m = test::random_model(family, at::kFloat, R"("tie_word_embeddings": true)", 11);
    const int64_t V = m.config().vocab_size;
    at::manual_seed(2);
    const at::Tensor prompt = at::randint(1, V, {3, 6}, at::kLong), step = at::randint(1, V, {3, 1}, at::kLong);
    auto run = [&] {  // a prefill of 3 slots, then one step of two of them
      KVCache cache = m.new_cache(3, 8);
      at::Tensor a = m.decode(cache, {0, 1, 2}, prompt);
      return std::make_pair(a, m.decode(cache, {2, 0}, step.narrow(0, 0, 2)));
    };
    const auto plain = run();
    {
      const CausalLM::DecodePacks packs = m.pack_weights_for_decode();
      // q, k, v, o, gate, up, down per layer and the (tied) lm_head.
      EXPECT_EQ(packs.size(), detail::packed_gemm_available() ? 7 * m.config().num_hidden_layers + 1 : 0) << family;
      const auto packed = run();
      EXPECT_LE((packed.first - plain.first).abs().max().item<double>(), 1e-5) << family;
      EXPECT_LE((packed.second - plain.second).abs().max().item<double>(), 1e-5) << family;
    }
    const auto after = run();  // the handle is gone: at::linear again, bit for bit
    EXPECT_TRUE(at::equal(after.first, plain.first) && at::equal(after.second, plain.second)) << family;
  }
}

// A bf16 model's decode packs its weights where the CPU has AVX512_BF16 (kPanelsBf16), and the
// packed decode agrees with the unpacked one (oneDNN's bf16 at::linear) to bf16's resolution:
// both sum in fp32 and round each product's result to bf16 once, in different orders.
TEST(PackedGemm, Bf16DecodeWithPackedWeightsAgreesWithDecodeWithout) {
  const bool bf16 = detail::cpu_has_avx512_bf16();
  for (const char* family : {"qwen2", "qwen3", "llama"}) {
    CausalLM m = test::random_model(family, at::kBFloat16, R"("tie_word_embeddings": true)", 11);
    const int64_t V = m.config().vocab_size;
    at::manual_seed(3);
    const at::Tensor prompt = at::randint(1, V, {3, 6}, at::kLong), step = at::randint(1, V, {3, 1}, at::kLong);
    auto run = [&] {
      KVCache cache = m.new_cache(3, 8);
      at::Tensor a = m.decode(cache, {0, 1, 2}, prompt);
      return std::make_pair(a.to(at::kFloat), m.decode(cache, {2, 0}, step.narrow(0, 0, 2)).to(at::kFloat));
    };
    const auto plain = run();
    const CausalLM::DecodePacks packs = m.pack_weights_for_decode();
    EXPECT_EQ(packs.size(), bf16 ? 7 * m.config().num_hidden_layers + 1 : 0) << family;
    const auto packed = run();
    for (const auto& [a, b] : {std::make_pair(packed.first, plain.first), std::make_pair(packed.second, plain.second)}) {
      // Logits of unit scale after a few bf16 layers: a few bf16 ulps (2^-8 relative) apart.
      const double scale = b.abs().max().item<double>();
      EXPECT_LE((a - b).abs().max().item<double>(), 0.05 * scale) << family;
      EXPECT_GT(at::cosine_similarity(a.flatten(), b.flatten(), 0).item<double>(), 0.999) << family;
    }
  }
}

// The bf16 panel kernels where the CPU has them (AVX512_BF16's VDPBF16PS; AMX's tile product on
// the same panels), each of them; elsewhere their backends are never chosen and pack nothing.
// - On inputs whose partial sums are all exact (multiples of 1/8 in [-1, 1]; exact in bf16 and
//   in every fp32 sum) each output is the exact x W^T + b rounded to bf16 once, bit for bit: odd
//   and even K (the zero last pair; for AMX a K not a multiple of 32), full and partial panels
//   of 32 columns, rows around the 8-row (VDPBF16PS) and 16- and 32-row (AMX) tiles.
// - On random bf16 inputs it is within the fp32 sums' error bound plus one bf16 rounding of the
//   fp64 product, and a row gives the same bits alone as inside batches of 2-17 rows.
// - The residual form equals residual + linear(x, b) as bf16 tensors add, bit for bit.
// - The fused gate + up + SwiGLU equals its three unfused steps bit for bit.
// - It refuses what it does not take: fp32 inputs, fp32 weights, mixed backends.
TEST(PackedGemm, Bf16PanelsRoundTheExactProductOnceAndRowsStandAlone) {
  using detail::PackedBackend;
  using detail::PackedWeight;
  EXPECT_EQ(detail::packed_backend_for(at::kFloat), detail::packed_backend());
  EXPECT_EQ(detail::packed_backend_for(at::kDouble), PackedBackend::kNone);
  const at::Tensor w_bf16 = at::randn({40, 24}).to(at::kBFloat16);
  EXPECT_EQ(detail::packed_backend_usable(PackedBackend::kPanelsBf16), detail::cpu_has_avx512_bf16());
  EXPECT_EQ(detail::packed_backend_usable(PackedBackend::kAmxBf16), detail::cpu_has_amx_bf16());
  if (!detail::cpu_has_avx512_bf16()) {
    EXPECT_EQ(detail::packed_backend_for(at::kBFloat16), PackedBackend::kNone);
    EXPECT_FALSE(PackedWeight::pack(w_bf16, PackedBackend::kPanelsBf16).defined());
    EXPECT_FALSE(PackedWeight::pack(w_bf16, PackedBackend::kAmxBf16).defined());
    return;
  }
  EXPECT_EQ(detail::packed_backend_for(at::kBFloat16),
            detail::cpu_has_amx_bf16() ? PackedBackend::kAmxBf16 : PackedBackend::kPanelsBf16);
  auto grid = [](int64_t count, int64_t salt) {
    return at::arange(count, at::kLong).mul_(7).add_(salt).remainder_(17).sub_(8).to(at::kFloat).div_(8);
  };
  for (PackedBackend backend : {PackedBackend::kPanelsBf16, PackedBackend::kAmxBf16}) {
    if (!detail::packed_backend_usable(backend)) continue;
    SCOPED_TRACE(detail::packed_backend_name(backend));
    for (auto [N, K] : {std::pair<int64_t, int64_t>{53, 45}, {32, 64}, {7, 130}, {96, 576}, {200, 1536}}) {
      SCOPED_TRACE(std::to_string(N) + " x " + std::to_string(K));
      // Exact: |sums| <= K / 64 + 1 < 2^8 in steps of 2^-6: every partial sum is exact in fp32.
      const at::Tensor wg = grid(N * K, 3).view({N, K}).to(at::kBFloat16), bg = grid(N, 5).to(at::kBFloat16);
      const PackedWeight pg = PackedWeight::pack(wg, backend);
      ASSERT_TRUE(pg.defined() && pg.backend() == backend);
      for (int64_t M : {1, 7, 8, 9, 15, 16, 17, 33, 64}) {
        const at::Tensor x = grid(M * K, M).view({M, K}).to(at::kBFloat16);
        const at::Tensor exact = at::linear(x.to(at::kDouble), wg.to(at::kDouble), bg.to(at::kDouble));
        EXPECT_TRUE(at::equal(pg.linear(x, bg), exact.to(at::kBFloat16))) << M << " rows";
        EXPECT_TRUE(at::equal(pg.linear(x, {}), at::linear(x.to(at::kDouble), wg.to(at::kDouble)).to(at::kBFloat16)))
            << M << " rows, no bias";
      }
      // Random: the error bound, rows alone, the residual.
      at::manual_seed(N + K);
      const at::Tensor w = at::randn({N, K}).to(at::kBFloat16), b = at::randn({N}).to(at::kBFloat16);
      const PackedWeight p = PackedWeight::pack(w, backend);
      ASSERT_TRUE(p.defined());
      const at::Tensor x = at::randn({17, K}).to(at::kBFloat16);
      const at::Tensor y = p.linear(x, b);
      ASSERT_EQ(y.scalar_type(), at::kBFloat16);
      const at::Tensor ref = at::linear(x.to(at::kDouble), w.to(at::kDouble), b.to(at::kDouble));
      const at::Tensor magnitude =
          at::linear(x.to(at::kDouble).abs(), w.to(at::kDouble).abs(), b.to(at::kDouble).abs());
      const at::Tensor bound =
          magnitude * (static_cast<double>(K + 1) * std::ldexp(1.0, -24)) + ref.abs() * std::ldexp(1.0, -8);
      EXPECT_TRUE(((y.to(at::kDouble) - ref).abs() <= bound * 1.01).all().item<bool>());
      for (int64_t M : {1, 2, 5, 8, 9, 16, 17})
        for (int64_t i = 0; i < M; ++i)
          ASSERT_TRUE(at::equal(p.linear(x.narrow(0, 0, M), b)[i], y[i])) << "row " << i << " of " << M;
      const at::Tensor residual = at::randn({17, N}).to(at::kBFloat16);
      EXPECT_TRUE(at::equal(p.linear(x, b, residual), residual + p.linear(x, b)));
      EXPECT_TRUE(at::equal(p.linear(x, {}, residual), residual + p.linear(x, {})));
      EXPECT_THROW(p.linear(x.to(at::kFloat), {}), c10::Error);
      EXPECT_THROW(p.linear(x, b.to(at::kFloat)), c10::Error);
      EXPECT_THROW(p.linear(x, {}, residual.to(at::kFloat)), c10::Error);
      // gate, up and SwiGLU in one pass: the bits of the two products, then the bf16 swiglu_rows.
      c10::NoGradGuard no_grad;  // as decode runs (swiglu_rows serves no autograd)
      for (int64_t M : {1, 8, 9, 17}) {
        const at::Tensor xm = x.narrow(0, 0, M);
        const at::Tensor fused = detail::swiglu_linear(p, pg, xm);
        ASSERT_TRUE(fused.defined() && fused.scalar_type() == at::kBFloat16);
        EXPECT_TRUE(at::equal(fused, detail::swiglu_rows(p.linear(xm, {}), pg.linear(xm, {})))) << M << " rows";
      }
      EXPECT_FALSE(detail::swiglu_linear(p, PackedWeight::pack(w.to(at::kFloat)), x).defined());  // mixed backends
      EXPECT_FALSE(detail::swiglu_linear(p, pg, x.to(at::kFloat)).defined());
    }
  }
  if (detail::cpu_has_amx_bf16()) {  // the two bf16 backends side by side are mixed too
    const PackedWeight a = PackedWeight::pack(w_bf16, PackedBackend::kAmxBf16);
    const PackedWeight v = PackedWeight::pack(w_bf16, PackedBackend::kPanelsBf16);
    EXPECT_FALSE(detail::swiglu_linear(a, v, at::randn({3, 24}).to(at::kBFloat16)).defined());
  }
  EXPECT_FALSE(PackedWeight::pack(at::randn({40, 24}), PackedBackend::kAmxBf16).defined());
  EXPECT_FALSE(PackedWeight::pack(at::randn({40, 24}), PackedBackend::kPanelsBf16).defined());
  EXPECT_FALSE(PackedWeight::pack(w_bf16, PackedBackend::kPanels512).defined());
}

// Decode's fused RMSNorm and RoPE against the ATen forms the training forward uses
// (transformers' RMSNorm in fp32; x * cos + rotate_half(x) * sin, with rotate_half written
// out), in fp64 from the same inputs: rows of a width that is and is not a multiple of the
// 16-lane loops, one and several positions, Qwen3's per-head norm shape; and the fused forms
// refuse what they do not take (autograd recording, bf16, a non-contiguous x).
TEST(DecodeElementwise, RmsNormRopeAndSwigluEqualTheAtenForms) {
  c10::NoGradGuard no_grad;  // as decode runs
  at::manual_seed(4);
  // 64 x 576 and 64 x 9 x 64: a decode step's rows, split between the threads.
  for (auto shape : {std::vector<int64_t>{3, 1, 576}, {2, 5, 37}, {4, 1, 9, 64}, {1, 1, 16}, {64, 1, 576}}) {
    const at::Tensor x = at::randn(shape) * 3, w = at::randn({shape.back()});
    const at::Tensor xd = x.to(at::kDouble);
    const at::Tensor ref = w.to(at::kDouble) * (xd * at::rsqrt(xd.pow(2).mean(-1, true) + 1e-6));
    const at::Tensor y = detail::rms_norm_rows(x, w, 1e-6);
    ASSERT_EQ(y.sizes(), x.sizes());
    EXPECT_LE((y.to(at::kDouble) - ref).abs().max().item<double>(), 1e-5 * ref.abs().max().item<double>())
        << at::IntArrayRef(shape);
  }
  for (auto [B, T, H, D] : {std::array<int64_t, 4>{3, 1, 9, 64}, {2, 4, 2, 128}, {1, 1, 1, 6}, {64, 1, 9, 64}}) {
    const at::Tensor x = at::randn({B, T, H, D}), ang = at::randn({B, T, 1, D / 2}) * 10;
    const at::Tensor cos = at::cat({ang, ang}, -1).cos(), sin = at::cat({-ang.sin(), ang.sin()}, -1);
    const at::Tensor xd = x.to(at::kDouble);
    const at::Tensor rotate_half = at::cat({-xd.narrow(-1, D / 2, D / 2), xd.narrow(-1, 0, D / 2)}, -1);
    const at::Tensor ref = xd * cos.to(at::kDouble) + rotate_half * at::cat({ang, ang}, -1).sin().to(at::kDouble);
    const at::Tensor y = detail::rope_rows(x, cos, sin);
    EXPECT_LE((y.to(at::kDouble) - ref).abs().max().item<double>(), 1e-5) << B << "x" << T << "x" << H << "x" << D;
  }
  // SwiGLU: silu(g) * u against fp64, relative to each output (both signs of g, large ones,
  // and the ends where exp underflows).
  // 63 x 1012 elements: split between the threads, with a tail past the last 16.
  at::Tensor g = at::cat({at::randn({63, 1, 1000}) * 4, at::tensor({0.0f, -0.0f, 30.0f, -30.0f, 88.0f, -88.0f, 100.0f,
                                                                    -100.0f, 1e-30f, -1e-30f, 5.0f, -5.0f}).view({1, 1, 12})
                                                       .expand({63, 1, 12})},
                     -1)
                   .contiguous();
  const at::Tensor u = at::randn(g.sizes()) * 2;
  const at::Tensor gd = g.to(at::kDouble);
  const at::Tensor want = gd * at::sigmoid(gd) * u.to(at::kDouble);
  const at::Tensor got = detail::swiglu_rows(g, u).to(at::kDouble);
  // Within 1e-6 of each output, plus 1e-30 (silu(-88) = -5e-37 comes out 0: exp(-88) flushes).
  EXPECT_TRUE(((got - want).abs() <= want.abs() * 1e-6 + 1e-30).all().item<bool>())
      << ((got - want).abs() / (want.abs() + 1e-24)).max().item<double>();
  const at::Tensor x = at::randn({2, 8});
  EXPECT_TRUE(detail::decode_elementwise_applies(x));
  EXPECT_TRUE(detail::decode_elementwise_applies(x.to(at::kBFloat16)));
  EXPECT_FALSE(detail::decode_elementwise_applies(x.to(at::kHalf)));
  EXPECT_FALSE(detail::decode_elementwise_applies(x.t()));
  EXPECT_THROW(detail::rms_norm_rows(x.to(at::kBFloat16), at::randn({8}), 1e-6), c10::Error);  // mixed dtypes
  EXPECT_THROW(detail::swiglu_rows(x, x.to(at::kBFloat16)), c10::Error);
  c10::AutoGradMode grad(true);
  EXPECT_FALSE(detail::decode_elementwise_applies(x));
}

// swiglu_rows in pieces of 1-17 elements (a piece of fewer than 16 was once left unwritten) equals
// the same elements inside one call, fp32 and bf16: its blocks of 16 and its tails compute the
// same bits.
TEST(DecodeElementwise, SwigluGivesEveryPieceTheBitsOfTheWhole) {
  c10::NoGradGuard no_grad;
  at::manual_seed(12);
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor g = (at::randn({400}) * 4).to(dtype), u = at::randn({400}).to(dtype);
    const at::Tensor whole = detail::swiglu_rows(g, u);
    for (int64_t at_ = 0, len = 1; at_ + len <= 400; at_ += len, len = len % 17 + 1)
      ASSERT_TRUE(at::equal(detail::swiglu_rows(g.narrow(0, at_, len).contiguous(), u.narrow(0, at_, len).contiguous()),
                            whole.narrow(0, at_, len)))
          << c10::toString(dtype) << " elements " << at_ << ".." << at_ + len;
  }
}

// bf16 rows against the ATen forms the bf16 training forward runs (layer.cpp: transformers'
// RMSNorm, RoPE with rotate_half, at::silu(gate) * up), from the same bf16 inputs. RoPE rounds
// where those ops round and gives their bits; RMSNorm sums its squares in another fp32 order and
// SwiGLU takes its own exp, so a value may land on the other side of a bf16 rounding: at most
// one bf16 ulp apart, and rarely.
TEST(DecodeElementwise, Bf16RowsRoundWhereTheAtenFormsRound) {
  c10::NoGradGuard no_grad;
  at::manual_seed(9);
  const auto bf = at::kBFloat16;
  // Elements apart by at most one bf16 ulp of the larger, and the share of those that differ.
  auto ulps_apart = [](const at::Tensor& a, const at::Tensor& b) {
    const at::Tensor ad = a.to(at::kDouble), bd = b.to(at::kDouble);
    const at::Tensor ulp = at::maximum(ad.abs(), bd.abs()) * std::ldexp(1.0, -7) + 1e-38;
    return std::make_pair(((ad - bd).abs() <= ulp).all().item<bool>(), (ad != bd).to(at::kDouble).mean().item<double>());
  };
  for (auto shape : {std::vector<int64_t>{3, 1, 576}, {2, 5, 37}, {4, 1, 9, 64}, {64, 1, 576}}) {
    const at::Tensor x = (at::randn(shape) * 3).to(bf), w = at::randn({shape.back()}).to(bf);
    const at::Tensor xf = x.to(at::kFloat);
    const at::Tensor aten = w * (xf * at::rsqrt(xf.pow(2).mean(-1, true) + 1e-6)).to(bf);
    const at::Tensor y = detail::rms_norm_rows(x, w, 1e-6);
    ASSERT_EQ(y.scalar_type(), bf);
    const auto [close, differ] = ulps_apart(y, aten);
    EXPECT_TRUE(close) << "RMSNorm " << x.sizes();
    EXPECT_LT(differ, 0.01) << "RMSNorm " << x.sizes();
  }
  for (auto [B, T, H, D] : {std::array<int64_t, 4>{3, 1, 9, 64}, {2, 4, 2, 16}, {64, 1, 3, 64}, {1, 3, 5, 40}}) {
    const at::Tensor x = at::randn({B, T, H, D}).to(bf);
    const at::Tensor ang = at::rand({B, T, 1, D / 2}) * 100;
    const at::Tensor s = ang.sin();
    const at::Tensor cos = at::cat({ang, ang}, -1).cos().to(bf), sin = at::cat({-s, s}, -1).to(bf);
    const at::Tensor swapped = at::cat({x.narrow(-1, D / 2, D / 2), x.narrow(-1, 0, D / 2)}, -1);
    EXPECT_TRUE(at::equal(detail::rope_rows(x, cos, sin), x * cos + swapped * sin))
        << B << "x" << T << "x" << H << "x" << D;
  }
  const at::Tensor g = (at::randn({63, 1, 1012}) * 4).to(bf), u = (at::randn({63, 1, 1012}) * 2).to(bf);
  const auto [close, differ] = ulps_apart(detail::swiglu_rows(g, u), at::silu(g) * u);
  EXPECT_TRUE(close) << "SwiGLU";
  EXPECT_LT(differ, 0.01) << "SwiGLU";
}

}  // namespace
}  // namespace rpg::model
