"""Oracle: the authors' fork's actor update (dp_actor.update_policy, lines 300-372 at
ec8e30bd) for ONE mini-batch, assembled from the fork's own core_algos functions
(compute_policy_loss, agg_loss, kl_penalty), for every distinct actor-loss setting of the 60
run scripts plus extra settings that reach every kl_penalty form and loss_agg_mode.

usage: algo_fork_parity.py FORK_DIR IN OUT SETTINGS_OUT
IN (tensor file): log_probs, old_log_probs, ref_log_probs, advantages, response_mask [B, T];
  dyn_partition [B] (micro-batch id per row, as rearrange_micro_batches would return it);
  config [micro_batch_size_per_gpu].
OUT: per setting i and dyn in {0, 1}: s<i>/d<dyn>/loss (sum of the weighted micro-batch
  losses = what backward accumulates) and s<i>/d<dyn>/grad (d/d log_probs), plus
  s<i>/d<dyn>/kl (kl_penalty on the whole batch) .
SETTINGS_OUT: one line per setting: index, origin (script name or "extra"), then
  clip_ratio_low clip_ratio_high clip_ratio_c loss_agg_mode entropy_coeff use_kl_loss
  kl_loss_coef kl_loss_type use_iterative_ref_model.
The entropy fed to the loss is -exp(log_prob) * log_prob (differentiable), on both sides.
"""
import json
import sys

import torch

from algo_verl_parity import read, write
import fork_modules
import fork_scripts

EXTRA = [
    dict(kl_loss_type=t, use_kl_loss=True, kl_loss_coef=0.5, use_iterative_ref_model=it,
         clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode=agg, entropy_coeff=0.01)
    for t, it, agg in [
        ("rpg_js", True, "token-mean"), ("rpg_ujs", True, "seq-mean-token-sum"),
        ("rpg_fkl", False, "seq-mean-token-mean"), ("rpg_rkl", True, "seq-mean-token-sum"),
        ("rpg_ufkl", True, "seq-mean-token-mean"), ("rpg_urkl", False, "token-mean"),
        ("rpg_rf_fkl", True, "token-mean"), ("rpg_rf_rkl_clip_hard", True, "token-mean"),
        ("rpg_rf_ufkl", True, "seq-mean-token-sum"), ("rpg_rf_urkl_clip_hard", True, "token-mean"),
        ("low_var_kl", False, "seq-mean-token-mean"), ("abs", False, "token-mean"),
        ("mse", True, "seq-mean-token-sum"), ("kl", False, "token-mean"),
    ]
]


def update(ca, s, t, dyn, micro_size):
    """dp_actor.update_policy for one mini-batch; returns (accumulated loss, grad, kl)."""
    theta = t["log_probs"].clone().requires_grad_(True)
    rows = theta.shape[0]
    ppo_mini_batch_size = rows
    if dyn:
        part = t["dyn_partition"].long()
        groups = [torch.nonzero(part == k).flatten() for k in sorted(set(part.tolist()))]
    else:
        groups = list(torch.arange(rows).split(micro_size))
    total = 0.0
    for idx in groups:
        log_prob = theta[idx]
        old_log_prob = t["old_log_probs"][idx]
        ref_log_prob = old_log_prob if s["use_iterative_ref_model"] else t["ref_log_probs"][idx]
        entropy = -torch.exp(log_prob) * log_prob
        loss, _, _ = fork_modules.dp_actor_loss(
            ca, s, log_prob, old_log_prob, t["advantages"][idx], t["response_mask"][idx], ref_log_prob, entropy,
            micro_rows=len(idx), mini_rows=ppo_mini_batch_size, use_dynamic_bsz=dyn, micro_size=micro_size)
        loss.backward()
        total += loss.item()
    ref = t["old_log_probs"] if s["use_iterative_ref_model"] else t["ref_log_probs"]
    kl = ca.kl_penalty(t["log_probs"], ref, s["kl_loss_type"]) if s["kl_loss_type"] != "full" else None
    return total, theta.grad.clone(), kl


def main():
    fork_dir, inp, out_path, settings_path = sys.argv[1:5]
    ca = fork_modules.core_algos(fork_dir)
    t = read(inp)
    micro_size = int(t["config"][0].item())
    settings = {}
    for path in fork_scripts.scripts(fork_dir):
        s = fork_scripts.loss_setting(fork_scripts.overrides(path))
        settings.setdefault(json.dumps(s, sort_keys=True), path.rsplit("/", 1)[-1])
    listed = [(json.loads(k), origin) for k, origin in settings.items()] + [(s, "extra") for s in EXTRA]
    out = {}
    with open(settings_path, "w") as f:
        for i, (s, origin) in enumerate(listed):
            f.write(" ".join(str(v) for v in [
                i, origin, s["clip_ratio_low"], s["clip_ratio_high"], s["clip_ratio_c"], s["loss_agg_mode"],
                s["entropy_coeff"], int(s["use_kl_loss"]), s["kl_loss_coef"], s["kl_loss_type"],
                int(s["use_iterative_ref_model"])]) + "\n")
            for dyn in (0, 1):
                loss, grad, kl = update(ca, s, t, dyn, micro_size)
                out[f"s{i}/d{dyn}/loss"] = torch.tensor(loss, dtype=torch.float64)
                out[f"s{i}/d{dyn}/grad"] = grad
                out[f"s{i}/d{dyn}/kl"] = kl
    write(out_path, out)


if __name__ == "__main__":
    main()
