// verl's performance metrics of a training step (verl.trainer.ppo.metric_utils
// compute_timing_metrics / compute_throughout_metrics, verl.utils.seqlen_balancing
// log_seqlen_unbalance, verl.utils.flops_counter), as pure functions of the step's token
// counts and phase times, so that tests compare them with verl's own functions.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "rpg/model/config.h"

namespace rpg::train {

// FLOPs of one forward + backward pass over sequences of `seqlens` real tokens (verl's
// _estimate_qwen2_flops, used by verl for qwen2 / qwen3 / llama): 6 x the dense parameters
// (attention and MLP projections of every layer, embedding + lm_head counted twice) x tokens,
// plus 6 x sum(L^2) x head_dim x heads x layers for attention scores. A forward alone is a
// third of it.
double training_flops(const model::ModelConfig& config, const std::vector<int64_t>& seqlens);

// Peak FLOP/s of a device as verl's flops_counter assumes it (its _DEVICE_FLOPS table by
// name: "CPU" is a nominal 448 GFLOP/s, H100/H200 989 TFLOP/s bf16 dense, ...); 0 when the
// name matches no entry (verl: infinity, i.e. an MFU of 0; rpg then logs no MFU).
double device_peak_flops(const std::string& device_name);

// timing_s/<name> for every phase and timing_per_token_ms/<name> for gen (per response
// token) and ref, values, adv, update_critic, update_actor (per prompt + response token),
// for the phases present (verl's compute_timing_metrics).
std::map<std::string, double> timing_metrics(const std::map<std::string, double>& timing_s, int64_t prompt_tokens,
                                             int64_t response_tokens);

// perf/total_num_tokens, perf/time_per_step, perf/throughput = tokens / (step seconds x
// devices) (verl's compute_throughout_metrics; tokens: the attention-mask sum of every row).
std::map<std::string, double> throughput_metrics(const std::vector<int64_t>& seqlens, double step_seconds,
                                                 int64_t devices);

// global_seqlen/{min,max,minmax_diff,balanced_min,balanced_max,mean}: token totals of the
// batch's `partitions.size()` contiguous equal chunks (as dispatched before balancing) and
// of the partitions the ranks actually process (verl's log_seqlen_unbalance).
std::map<std::string, double> seqlen_balance_metrics(const std::vector<int64_t>& seqlens,
                                                     const std::vector<std::vector<int64_t>>& partitions);

// Peak resident set size of this process in GiB (getrusage; 0 where unknown).
double peak_rss_gb();

// CPU seconds (user + sys) of this process so far, every thread included (getrusage): the
// perf/cpu_s/* metrics, which unlike wall time do not grow with other processes' load.
double process_cpu_seconds();

}  // namespace rpg::train
