// Helpers of the algo tests: a categorical policy over K outcomes whose exact objective is
// known in closed form, the token-level batch that places one outcome among padding, and
// a plain-text tensor file format shared with the Python oracles (tests/oracles/algo_*.py).
#pragma once

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "rpg/algo/kl.h"
#include "rpg/algo/policy_loss.h"

namespace rpg::algo {
// GoogleTest prints parameters with this instead of their bytes.
inline void PrintTo(Divergence d, std::ostream* os) { *os << to_string(d); }
}  // namespace rpg::algo

namespace rpg::algo::test {

// J(theta) = E_{pi_theta}[R] - beta * Div, written straight from the definitions
// (Definitions 3.1, 3.4, Appendix E) on the full distributions: p = softmax(theta) [K],
// log_old [K] the log of the (possibly unnormalised, mass Z) measure pi_old.
inline at::Tensor objective(const at::Tensor& theta, const at::Tensor& R, const at::Tensor& log_old,
                            Divergence kl, double beta) {
  auto log_p = at::log_softmax(theta, 0);
  auto p = log_p.exp();
  auto old = log_old.exp();
  at::Tensor div;
  switch (kl) {
    case Divergence::FKL: div = (old * (log_old - log_p)).sum(); break;           // KL(old || p)
    case Divergence::RKL: div = (p * (log_p - log_old)).sum(); break;             // KL(p || old)
    case Divergence::UFKL: div = (old * (log_old - log_p)).sum() + (p - old).sum(); break;
    case Divergence::URKL: div = (p * (log_p - log_old)).sum() + (old - p).sum(); break;
  }
  return (p * R).sum() - beta * div;
}

inline at::Tensor grad_of(const at::Tensor& y, const at::Tensor& x) {
  return torch::autograd::grad({y}, {x}, {}, /*retain_graph=*/true)[0];
}

// One sampled outcome x placed at token `pos` of row 0 of a [2, 3] batch; every other
// position is padding whose values depend on theta too (so a leak through the mask would
// change the gradient) and row 1 is fully masked.
inline PolicyLossInputs one_outcome_batch(const at::Tensor& log_p, const at::Tensor& log_old,
                                          const at::Tensor& adv, int64_t x, int64_t pos) {
  const int64_t K = log_p.size(0);
  auto garbage_idx = at::tensor({(x + 1) % K, (x + 2) % K, (x + 3) % K, (x + 4) % K, (x + 5) % K, (x + 6) % K},
                                at::kLong).view({2, 3});
  auto lp = log_p.index_select(0, garbage_idx.flatten()).view({2, 3}) * 1.3;
  auto old = log_old.detach().index_select(0, garbage_idx.flatten()).view({2, 3}) - 0.7;
  auto a = at::full({2, 3}, 5.0, at::kDouble);
  auto mask = at::zeros({2, 3}, at::kDouble);
  mask.index_put_({0, pos}, 1.0);
  // Place the outcome (index_put keeps the graph to log_p).
  auto sel = at::zeros({2, 3}, at::kBool);
  sel.index_put_({0, pos}, true);
  lp = at::where(sel, log_p[x], lp);
  old = at::where(sel, log_old.detach()[x], old);
  a = at::where(sel, adv.detach()[x], a);
  PolicyLossInputs in;
  in.log_probs = lp;
  in.old_log_probs = old;
  in.advantages = a;
  in.response_mask = mask;
  in.normaliser = 1.0;
  return in;
}

// ---- tensor files: "name ndim d0 .. dn-1\n v0 v1 ...\n" per tensor, values as %.17g ----

inline void write_tensors(const std::filesystem::path& path, const std::map<std::string, at::Tensor>& tensors) {
  std::ofstream out(path);
  out << std::setprecision(17);
  for (const auto& [name, t] : tensors) {
    auto c = t.detach().to(at::kDouble).contiguous().flatten();
    out << name << ' ' << t.dim();
    for (auto d : t.sizes()) out << ' ' << d;
    out << '\n';
    const double* v = c.data_ptr<double>();
    for (int64_t i = 0; i < c.numel(); ++i) out << (i ? " " : "") << v[i];
    out << '\n';
  }
  if (!out) throw std::runtime_error("cannot write " + path.string());
}

inline std::map<std::string, at::Tensor> read_tensors(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read " + path.string());
  std::map<std::string, at::Tensor> out;
  std::string header, values;
  while (std::getline(in, header) && std::getline(in, values)) {
    std::istringstream hs(header), vs(values);
    std::string name;
    int64_t ndim = 0;
    hs >> name >> ndim;
    std::vector<int64_t> shape(ndim);
    int64_t numel = 1;
    for (auto& d : shape) {
      hs >> d;
      numel *= d;
    }
    std::vector<double> data;
    double v;
    while (vs >> v) data.push_back(v);
    if (static_cast<int64_t>(data.size()) != numel)
      throw std::runtime_error("tensor " + name + ": expected " + std::to_string(numel) + " values");
    out[name] = at::tensor(data, at::kDouble).view(shape).clone();
  }
  return out;
}

inline double max_abs_diff(const at::Tensor& a, const at::Tensor& b) {
  return (a.to(at::kDouble) - b.to(at::kDouble)).abs().max().item<double>();
}

}  // namespace rpg::algo::test
