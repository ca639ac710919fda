#include "rpg/train/perf_metrics.h"

#include <sys/resource.h>

#include <algorithm>
#include <numeric>
#include <utility>

namespace rpg::train {

double training_flops(const model::ModelConfig& c, const std::vector<int64_t>& seqlens) {
  const double head_dim = static_cast<double>(c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_attention_heads);
  const double hidden = static_cast<double>(c.hidden_size);
  const double q = static_cast<double>(c.num_attention_heads) * head_dim;
  const double kv = static_cast<double>(c.num_key_value_heads) * head_dim;
  const double mlp = hidden * static_cast<double>(c.intermediate_size) * 3;
  const double attn_linear = hidden * (q + kv + kv + q);  // q, k, v and o projections
  const double embed_and_head = static_cast<double>(c.vocab_size) * hidden * 2;
  const double dense = (mlp + attn_linear) * static_cast<double>(c.num_hidden_layers) + embed_and_head;
  double tokens = 0, square_sum = 0;
  for (const int64_t l : seqlens) {
    tokens += static_cast<double>(l);
    square_sum += static_cast<double>(l) * static_cast<double>(l);
  }
  return 6 * dense * tokens +
         6 * square_sum * head_dim * static_cast<double>(c.num_attention_heads) * static_cast<double>(c.num_hidden_layers);
}

double device_peak_flops(const std::string& device_name) {
  // verl.utils.flops_counter._DEVICE_FLOPS; verl takes the first key, in reverse-sorted
  // order, that the device name contains (so "H200" wins over "H20").
  static const std::vector<std::pair<std::string, double>> table = {
      {"CPU", 448e9},       {"GB200", 2.5e15},     {"B200", 2.25e15},    {"MI300X", 1307e12},
      {"MI350X", 2300e12},  {"MI355X", 2500e12},   {"H100", 989e12},     {"H800", 989e12},
      {"H200", 989e12},     {"A100", 312e12},      {"A800", 312e12},     {"L40S", 362.05e12},
      {"L40", 181.05e12},   {"A40", 149.7e12},     {"L20", 119.5e12},    {"H20", 148e12},
      {"910B", 354e12},     {"A2G3", 354e12},      {"Ascend950DT", 432e12}, {"Ascend910", 354e12},
      {"RTX 3070 Ti", 21.75e12}};
  std::vector<std::pair<std::string, double>> sorted = table;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  for (const auto& [key, flops] : sorted)
    if (device_name.find(key) != std::string::npos) return flops;
  return 0.0;
}

std::map<std::string, double> timing_metrics(const std::map<std::string, double>& timing_s, int64_t prompt_tokens,
                                             int64_t response_tokens) {
  std::map<std::string, double> out;
  const double overall = static_cast<double>(prompt_tokens + response_tokens);
  for (const auto& [name, seconds] : timing_s) {
    out["timing_s/" + name] = seconds;
    double tokens = -1;
    if (name == "gen") tokens = static_cast<double>(response_tokens);
    for (const char* section : {"ref", "values", "adv", "update_critic", "update_actor"})
      if (name == section) tokens = overall;
    if (tokens >= 0) out["timing_per_token_ms/" + name] = tokens > 0 ? seconds * 1000 / tokens : 0.0;
  }
  return out;
}

std::map<std::string, double> throughput_metrics(const std::vector<int64_t>& seqlens, double step_seconds,
                                                 int64_t devices) {
  const double total = static_cast<double>(std::accumulate(seqlens.begin(), seqlens.end(), int64_t{0}));
  return {{"perf/total_num_tokens", total},
          {"perf/time_per_step", step_seconds},
          {"perf/throughput", total / (step_seconds * static_cast<double>(devices))}};
}

std::map<std::string, double> seqlen_balance_metrics(const std::vector<int64_t>& seqlens,
                                                     const std::vector<std::vector<int64_t>>& partitions) {
  const size_t k = std::max<size_t>(1, partitions.size());
  const size_t chunk = std::max<size_t>(1, seqlens.size() / k);
  double lo = 0, hi = 0, total = 0;
  bool first = true;
  for (size_t offset = 0; offset < seqlens.size(); offset += chunk) {
    double sum = 0;
    for (size_t i = offset; i < std::min(seqlens.size(), offset + chunk); ++i) sum += static_cast<double>(seqlens[i]);
    lo = first ? sum : std::min(lo, sum);
    hi = first ? sum : std::max(hi, sum);
    first = false;
    total += sum;
  }
  double blo = 0, bhi = 0;
  for (size_t p = 0; p < partitions.size(); ++p) {
    double sum = 0;
    for (const int64_t i : partitions[p]) sum += static_cast<double>(seqlens[static_cast<size_t>(i)]);
    blo = p == 0 ? sum : std::min(blo, sum);
    bhi = p == 0 ? sum : std::max(bhi, sum);
  }
  return {{"global_seqlen/min", lo},           {"global_seqlen/max", hi},
          {"global_seqlen/minmax_diff", hi - lo}, {"global_seqlen/balanced_min", blo},
          {"global_seqlen/balanced_max", bhi}, {"global_seqlen/mean", total / static_cast<double>(k)}};
}

double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

double peak_rss_gb() {
  struct rusage u {};
  if (getrusage(RUSAGE_SELF, &u) != 0) return 0.0;
  return static_cast<double>(u.ru_maxrss) / (1024.0 * 1024.0);  // Linux: KiB
}

}  // namespace rpg::train
