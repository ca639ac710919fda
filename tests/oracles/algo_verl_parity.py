"""Oracle: verl's own core_algos on the inputs the C++ test wrote.

usage: algo_verl_parity.py IN OUT
IN / OUT are tensor files: per tensor a line "name ndim d0 .. dn-1" then a line of values.
Computes, with verl.trainer.ppo.core_algos (the PyPI package, nothing of ours):
  adv/<name>         advantages of grpo, grpo without std (Dr.GRPO), rloo,
                     reinforce_plus_plus (gamma), reinforce_plus_plus_baseline
  ppo/<mode>/loss, ppo/<mode>/grad, ppo/<mode>/<metric>
                     vanilla policy loss (clip-higher + dual-clip) per loss_agg_mode, and
                     its gradient w.r.t. log_prob
  gspo/loss, gspo/grad, cispo/loss, cispo/grad
  rewards_kl         compute_rewards(scores, old, ref, 0.05): REINFORCE++'s KL-shaped reward
  kl/<estimator>     kl_penalty(log_prob, ref_log_prob, estimator)
  micro/<mode>/loss  agg_loss of the first `split` rows with the whole batch's normaliser
"""
import sys

import numpy as np
import torch

from verl.trainer.ppo import core_algos
from verl.workers.config import ActorConfig


def read(path):
    out = {}
    with open(path) as f:
        lines = f.read().splitlines()
    for header, values in zip(lines[0::2], lines[1::2]):
        parts = header.split()
        name, ndim = parts[0], int(parts[1])
        shape = [int(d) for d in parts[2:2 + ndim]]
        data = [float(v) for v in values.split()] if values.strip() else []
        out[name] = torch.tensor(data, dtype=torch.float64).reshape(shape)
    return out


def write(path, tensors):
    with open(path, "w") as f:
        for name, t in tensors.items():
            t = torch.as_tensor(t).detach().to(torch.float64)
            shape = list(t.shape)
            f.write(" ".join([name, str(len(shape))] + [str(d) for d in shape]) + "\n")
            f.write(" ".join(repr(float(v)) for v in t.reshape(-1).tolist()) + "\n")


def scalar(v):
    return torch.tensor(float(v), dtype=torch.float64)


def main():
    inp = read(sys.argv[1])
    cfg = inp["config"].tolist()  # clip_low, clip_high, clip_c, gamma, split, loss_scale_factor
    clip_low, clip_high, clip_c, gamma, split, scale = cfg
    split = int(split)
    rewards = inp["token_level_rewards"]
    mask = inp["response_mask"]
    index = np.array([int(v) for v in inp["group_index"].tolist()])
    out = {}

    class AlgoCfg:  # the attributes verl's estimators read
        pass

    algo_cfg = AlgoCfg()
    algo_cfg.gamma = gamma
    out["adv/grpo"] = core_algos.compute_grpo_outcome_advantage(rewards.clone(), mask, index, epsilon=1e-6)[0]
    out["adv/drgrpo"] = core_algos.compute_grpo_outcome_advantage(
        rewards.clone(), mask, index, epsilon=1e-6, norm_adv_by_std_in_grpo=False)[0]
    out["adv/rloo"] = core_algos.compute_rloo_outcome_advantage(rewards.clone(), mask, index)[0]
    adv, ret = core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards.clone(), mask, config=algo_cfg)
    out["adv/rfpp"] = adv
    out["ret/rfpp"] = ret
    out["adv/rfppb"] = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(
        rewards.clone(), mask, index)[0]

    old = inp["old_log_probs"]
    ref = inp["ref_log_probs"]
    advantages = inp["advantages"]
    for mode in ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]:
        actor = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=clip_low,
                            clip_ratio_low=clip_low, clip_ratio_high=clip_high, clip_ratio_c=clip_c,
                            loss_agg_mode=mode)
        if mode == "seq-mean-token-sum-norm":
            actor.global_batch_info["loss_scale_factor"] = scale
        lp = inp["log_probs"].clone().requires_grad_(True)
        loss, metrics = core_algos.get_policy_loss_fn("vanilla")(old, lp, advantages, mask, mode, actor)
        loss.backward()
        out[f"ppo/{mode}/loss"] = scalar(loss.item())
        out[f"ppo/{mode}/grad"] = lp.grad
        for k, v in metrics.items():
            out[f"ppo/{mode}/{k}"] = scalar(v)

    for name in ["gspo", "cispo"]:
        actor = ActorConfig(strategy="fsdp", rollout_n=1, ppo_micro_batch_size_per_gpu=1, clip_ratio=clip_low,
                            clip_ratio_low=clip_low, clip_ratio_high=clip_high, loss_agg_mode="token-mean")
        lp = inp["log_probs"].clone().requires_grad_(True)
        loss, metrics = core_algos.get_policy_loss_fn(name)(old, lp, advantages, mask, "token-mean", actor)
        loss.backward()
        out[f"{name}/loss"] = scalar(loss.item())
        out[f"{name}/grad"] = lp.grad
        out[f"{name}/actor/pg_clipfrac"] = scalar(metrics["actor/pg_clipfrac"])

    # REINFORCE++: KL folded into the token reward (k1 of pi_old vs pi_ref, coefficient 0.05).
    out["rewards_kl"] = core_algos.compute_rewards(rewards, old, ref, 0.05)

    lp = inp["log_probs"]
    for est in ["kl", "abs", "mse", "low_var_kl"]:
        out[f"kl/{est}"] = core_algos.kl_penalty(lp, ref, est)

    # Micro-batch: the first `split` rows, normalised by the whole batch (verl's global_batch_info).
    loss_mat = inp["loss_mat"]
    n_tokens = mask.sum().item()
    n_seqs = (mask.sum(-1) > 0).sum().item()
    for mode in ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]:
        v = core_algos.agg_loss(loss_mat[:split], mask[:split], mode, batch_num_tokens=n_tokens,
                                global_batch_size=n_seqs, loss_scale_factor=scale)
        out[f"micro/{mode}/loss"] = scalar(v.item())
    write(sys.argv[2], out)


if __name__ == "__main__":
    main()
