#include "rpg/rollout/batch.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <numeric>
#include <set>

#include "rpg/core/error.h"
#include "rpg/core/rng.h"
#include "rpg/rollout/response.h"
#include "tensor_file.h"
#include "test_util.h"

namespace rpg::rollout {
namespace {

Response response(int64_t prompt, std::vector<int64_t> ids) {
  Response r;
  r.prompt_index = prompt;
  r.token_ids = ids;
  for (size_t i = 0; i < ids.size(); ++i) r.log_probs.push_back(-0.5f - static_cast<float>(i));
  return r;
}

TEST(RolloutBatch, LayoutMatchesVerl) {
  const int64_t eos = 2, pad = 0;
  std::vector<std::vector<int64_t>> prompts = {{11, 12, 13}, {21}, {31, 32, 33, 34, 35}};
  std::vector<Response> rs = {response(0, {5, 6, eos}), response(0, {7, 8, 9, 10, 11}), response(1, {eos}),
                              response(2, {4, 4, 4, eos}), response(2, {3, 3, 3, 3, 3})};
  Batch b = make_rollout_batch(prompts, rs, pad);
  ASSERT_EQ(b.rows(), 5);
  EXPECT_EQ(b.get("prompts").sizes(), (at::IntArrayRef{5, 5}));
  EXPECT_EQ(b.get("responses").sizes(), (at::IntArrayRef{5, 5}));
  EXPECT_EQ(b.get("input_ids").size(1), 10);
  // Left-padded prompt, right-padded response. A response ends with the stop token or has
  // the full length (max_new_tokens), so verl's mask from the EOS position is ours.
  EXPECT_TRUE(at::equal(b.get("prompts")[2], at::tensor(std::vector<int64_t>{0, 0, 0, 0, 21}))) << b.get("prompts");
  EXPECT_TRUE(at::equal(b.get("responses")[3], at::tensor(std::vector<int64_t>{4, 4, 4, eos, 0})));
  EXPECT_TRUE(at::equal(b.get("group_index"), at::tensor({0, 0, 1, 2, 2}, at::kLong)));
  EXPECT_FLOAT_EQ(b.get("rollout_log_probs")[1][4].item<float>(), -4.5f);
  EXPECT_FLOAT_EQ(b.get("rollout_log_probs")[2][1].item<float>(), 0.0f);

  test::TempDir dir;
  test::save_tensors(dir / "in.safetensors", {{"responses", b.get("responses")}, {"attention_mask", b.get("attention_mask")}});
  test::run_oracle("rollout_verl_layout.py",
                   {(dir / "in.safetensors").string(), std::to_string(eos), (dir / "out.safetensors").string()});
  auto ref = test::load_tensors(dir / "out.safetensors");
  EXPECT_TRUE(at::equal(b.get("response_mask"), ref.at("response_mask").to(at::kLong))) << b.get("response_mask");
  EXPECT_TRUE(at::equal(b.get("position_ids"), ref.at("position_ids").to(at::kLong))) << b.get("position_ids");
  // Minimum lengths keep shapes fixed.
  Batch fixed = make_rollout_batch(prompts, rs, pad, 8, 16);
  EXPECT_EQ(fixed.get("input_ids").sizes(), (at::IntArrayRef{5, 24}));
}

TEST(RolloutBatch, SelectConcatAndErrors) {
  Batch b;
  b.set("x", at::arange(4, at::kLong));
  b.set("y", at::arange(8, at::kFloat).reshape({4, 2}));
  b.set_strings("s", {"a", "b", "c", "d"});
  Batch s = b.select({3, 1, 1});
  EXPECT_TRUE(at::equal(s.get("x"), at::tensor({3, 1, 1}, at::kLong)));
  EXPECT_EQ(s.strings("s"), (std::vector<std::string>{"d", "b", "b"}));
  Batch c = Batch::concat({b, s});
  EXPECT_EQ(c.rows(), 7);
  EXPECT_EQ(c.strings("s")[6], "b");
  EXPECT_THROW(b.set("z", at::zeros({3})), ValueError);
  EXPECT_THROW(b.set_strings("t", {"a"}), ValueError);
  EXPECT_THROW(b.select({4}), ValueError);
  try {
    b.get("old_log_probs");
    FAIL();
  } catch (const ValueError& e) {
    EXPECT_NE(std::string(e.what()).find("batch has no tensor 'old_log_probs' (it has: s, x, y)"), std::string::npos)
        << e.what();
  }
}

TEST(RolloutBatch, SplitByRows) {
  auto parts = split_by_rows(7, 3);
  ASSERT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[2], (std::vector<int64_t>{6}));
  EXPECT_THROW(split_by_rows(3, 0), ValueError);
}

TEST(RolloutBatch, SplitByTokensRespectsTheBudgetAndCoversEveryRowOnce) {
  RandomStream rs(123);
  for (int trial = 0; trial < 200; ++trial) {
    std::vector<int64_t> lengths(1 + rs.next_u64() % 40);
    for (auto& l : lengths) l = 1 + static_cast<int64_t>(rs.next_u64() % 100);
    const int64_t budget = 100 + static_cast<int64_t>(rs.next_u64() % 300);
    auto parts = split_by_tokens(lengths, budget);
    std::multiset<int64_t> seen;
    int64_t total = std::accumulate(lengths.begin(), lengths.end(), int64_t{0});
    for (const auto& p : parts) {
      int64_t sum = 0;
      ASSERT_FALSE(p.empty());
      ASSERT_TRUE(std::is_sorted(p.begin(), p.end()));
      for (int64_t r : p) sum += lengths[static_cast<size_t>(r)], seen.insert(r);
      ASSERT_LE(sum, budget);
    }
    ASSERT_EQ(seen.size(), lengths.size());
    for (int64_t r = 0; r < static_cast<int64_t>(lengths.size()); ++r) ASSERT_EQ(seen.count(r), 1u);
    // Never more than twice the lower bound ceil(total / budget) (first-fit guarantee).
    ASSERT_LE(static_cast<int64_t>(parts.size()), 2 * ((total + budget - 1) / budget));
  }
  EXPECT_THROW(split_by_tokens({5, 200}, 100), ValueError);
}

}  // namespace
}  // namespace rpg::rollout
