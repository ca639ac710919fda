// Device placement of the sampler and the batch helpers without a GPU: logits and batch
// tensors on PyTorch's "meta" device (shapes only). Meta, like CUDA, refuses to combine its
// tensors with a CPU tensor of one or more dimensions, so a tensor made on the CPU without the
// logits' device and then mixed with them throws here as on trainer.device=cuda (this is how
// sample_tokens' CPU uniforms times the CUDA CDF showed up: "Expected all tensors to be on the
// same device, but found at least two devices, meta and cpu!"). The C++ library has no meta
// kernel for searchsorted and index_select (Python registers them in
// torch/_meta_registrations.py): this file registers them with CUDA's rule, both operands on
// one device. The engine itself reads tokens back with .cpu() and cannot run on meta.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/library.h>

#include <functional>
#include <string>

#include "rpg/core/error.h"
#include "rpg/rollout/batch.h"
#include "rpg/rollout/sampler.h"

namespace {

at::Tensor meta_searchsorted(const at::Tensor& sorted, const at::Tensor& self, bool out_int32, bool,
                             std::optional<c10::string_view>, const std::optional<at::Tensor>&) {
  TORCH_CHECK(sorted.device() == self.device(), "Expected all tensors to be on the same device, but found at least two devices, ",
              sorted.device(), " and ", self.device(), "! (when checking argument self in method searchsorted)");
  return at::empty(self.sizes(), self.options().dtype(out_int32 ? at::kInt : at::kLong));
}

at::Tensor meta_index_select(const at::Tensor& self, int64_t dim, const at::Tensor& index) {
  TORCH_CHECK(index.device() == self.device(), "Expected all tensors to be on the same device, but found at least two devices, ",
              self.device(), " and ", index.device(), "! (when checking argument index in method index_select)");
  auto sizes = self.sizes().vec();
  sizes[static_cast<size_t>(at::maybe_wrap_dim(dim, self.dim()))] = index.numel();
  return at::empty(sizes, self.options());
}

TORCH_LIBRARY_IMPL(aten, Meta, m) {
  m.impl("searchsorted.Tensor", meta_searchsorted);
  m.impl("index_select", meta_index_select);
}

void runs_on_meta(const std::string& what, const std::function<void()>& f) {
  try {
    f();
  } catch (const std::exception& e) {
    ADD_FAILURE() << what << ": " << std::string(e.what()).substr(0, 400);
  }
}

void expect_on_meta(const std::string& what, const at::Tensor& t) {
  ASSERT_TRUE(t.defined()) << what;
  EXPECT_TRUE(t.is_meta()) << what << " is on " << t.device();
}

}  // namespace

namespace rpg::rollout {
namespace {

TEST(DeviceMixing, SamplerStaysOnTheLogitsDevice) {
  for (auto dtype : {at::kFloat, at::kBFloat16}) {
    const at::Tensor logits = at::empty({3, 11}, at::TensorOptions().dtype(dtype).device(at::kMeta));
    for (double temperature : {0.0, 0.7})
      for (double top_p : {1.0, 0.9})
        for (int64_t top_k : {int64_t{-1}, int64_t{4}}) {
          SamplingParams p;
          p.temperature = temperature;
          p.top_p = top_p;
          p.top_k = top_k;
          const std::string what = str(dtype, " T=", temperature, " top_p=", top_p, " top_k=", top_k);
          runs_on_meta(what, [&] {
            // The engine's eager path: host uniforms, one per row.
            SampledTokens s = sample_tokens(logits, p, {0.1, 0.5, 0.9});
            expect_on_meta(what + " ids", s.ids);
            expect_on_meta(what + " log_probs", s.log_probs);
            // Fixed-slot decoding: uniforms already on the device.
            const at::Tensor u = at::empty({3}, at::TensorOptions().dtype(at::kDouble).device(at::kMeta));
            SampledTokens d = sample_tokens_on_device(logits, p, temperature == 0.0 ? at::Tensor() : u);
            expect_on_meta(what + " device ids", d.ids);
            expect_on_meta(what + " device log_probs", d.log_probs);
            if (temperature > 0) expect_on_meta(what + " probs", sampling_probs(logits, p));
          });
        }
  }
}

TEST(DeviceMixing, BatchSelectAndConcatStayOnTheTensorsDevice) {
  Batch b;
  b.set("responses", at::empty({4, 5}, at::TensorOptions().dtype(at::kLong).device(at::kMeta)));
  b.set("old_log_probs", at::empty({4, 5}, at::TensorOptions().dtype(at::kFloat).device(at::kMeta)));
  runs_on_meta("select / concat", [&] {
    Batch s = b.select({3, 1, 1});
    expect_on_meta("selected responses", s.get("responses"));
    expect_on_meta("concatenated", Batch::concat({s, b}).get("old_log_probs"));
  });
}

}  // namespace
}  // namespace rpg::rollout
