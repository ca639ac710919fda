"""Loads the authors' verl fork (complex-reasoning/RPG @ ec8e30bd, provisioned by
scripts/setup.sh; its path is passed in by the C++ test) as oracle modules, unchanged.

The fork's files import `verl.*`; the installed verl is 0.9.1 (no-deps). The shims, kept
here and never in the fork's files:
  - core_algos imports `verl.utils.torch_functional as verl_F`: the fork's own
    torch_functional.py is loaded and bound to that name while core_algos executes, so
    masked_mean & co. are the fork's (the installed module is restored afterwards);
  - math_dapo.py imports nothing of verl and loads as is.

dp_actor_loss() is the one transcription of the fork's per-micro-batch actor loss
(dp_actor.update_policy, lines 300-372 at ec8e30bd) built from those functions, shared by
the oracles that need it (algo_fork_parity.py, train_fork_step.py).
"""
import importlib.util
import os
import sys


def _load(name, path):
    if not os.path.isfile(path):
        raise SystemExit(f"fork oracle: {path} is missing (run scripts/setup.sh)")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def core_algos(fork_dir):
    import verl.utils  # the parent package must exist before a submodule is swapped in
    fork_tf = _load("rpg_fork_torch_functional", os.path.join(fork_dir, "verl/utils/torch_functional.py"))
    key = "verl.utils.torch_functional"
    saved = sys.modules.get(key)
    saved_attr = getattr(verl.utils, "torch_functional", None)
    sys.modules[key] = fork_tf
    verl.utils.torch_functional = fork_tf
    try:
        module = _load("rpg_fork_core_algos", os.path.join(fork_dir, "verl/trainer/ppo/core_algos.py"))
    finally:
        if saved is not None:
            sys.modules[key] = saved
        else:
            sys.modules.pop(key, None)
        if saved_attr is not None:
            verl.utils.torch_functional = saved_attr
    assert module.verl_F is fork_tf
    return module


def math_dapo(fork_dir):
    return _load("rpg_fork_math_dapo", os.path.join(fork_dir, "verl/utils/reward_score/math_dapo.py"))


def dp_actor_loss(ca, s, log_prob, old_log_prob, advantages, response_mask, ref_log_prob, entropy,
                  micro_rows, mini_rows, use_dynamic_bsz, micro_size):
    """The loss dp_actor.update_policy calls backward() on for one micro-batch (lines 336-372):
    compute_policy_loss (dual-clip PPO) - entropy_coeff * agg_loss(entropy)
    [+ kl_loss_coef * agg_loss(kl_penalty(log_prob, ref_log_prob, kl_loss_type)) with use_kl_loss],
    times micro_rows / mini_rows (use_dynamic_bsz) or divided by mini_rows // micro_size.
    `ca` is core_algos() of the fork; `s` holds the actor's settings: clip_ratio (optional,
    the fallback of low/high), clip_ratio_low, clip_ratio_high, clip_ratio_c, loss_agg_mode,
    entropy_coeff, use_kl_loss, kl_loss_coef, kl_loss_type. Returns (loss, pg_loss, kl_loss or None)."""
    pg_loss, _, _, _ = ca.compute_policy_loss(
        old_log_prob=old_log_prob, log_prob=log_prob, advantages=advantages, response_mask=response_mask,
        cliprange=s.get("clip_ratio", 0.2), cliprange_low=s["clip_ratio_low"], cliprange_high=s["clip_ratio_high"],
        clip_ratio_c=s["clip_ratio_c"], loss_agg_mode=s["loss_agg_mode"])
    entropy_loss = ca.agg_loss(loss_mat=entropy, loss_mask=response_mask, loss_agg_mode=s["loss_agg_mode"])
    policy_loss = pg_loss - entropy_loss * s["entropy_coeff"]
    kl_loss = None
    if s["use_kl_loss"]:
        kld = ca.kl_penalty(logprob=log_prob, ref_logprob=ref_log_prob, kl_penalty=s["kl_loss_type"])
        kl_loss = ca.agg_loss(loss_mat=kld, loss_mask=response_mask, loss_agg_mode=s["loss_agg_mode"])
        policy_loss = policy_loss + kl_loss * s["kl_loss_coef"]
    if use_dynamic_bsz:
        loss = policy_loss * (micro_rows / mini_rows)
    else:
        gradient_accumulation = mini_rows // micro_size
        loss = policy_loss / gradient_accumulation
    return loss, pg_loss, kl_loss


def balance_batch(fork_dir):
    """The fork's RayPPOTrainer._balance_batch (verl/trainer/ppo/ray_trainer.py), unchanged: its
    source is taken from the fork's file and run with the names it uses (torch, the installed
    verl's get_seqlen_balanced_partitions and log_seqlen_unbalance), without importing the
    trainer module (Ray, vLLM, ...). Call it as f(trainer, batch, metrics), `trainer` any object
    with .actor_rollout_wg.world_size."""
    import ast
    import torch
    from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions, log_seqlen_unbalance
    path = os.path.join(fork_dir, "verl/trainer/ppo/ray_trainer.py")
    if not os.path.isfile(path):
        raise SystemExit(f"fork oracle: {path} is missing (run scripts/setup.sh)")
    source = open(path).read()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and node.name == "_balance_batch":
            namespace = {"torch": torch, "DataProto": object,
                         "get_seqlen_balanced_partitions": get_seqlen_balanced_partitions,
                         "log_seqlen_unbalance": log_seqlen_unbalance}
            exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
            return namespace["_balance_batch"]
    raise SystemExit(f"fork oracle: no _balance_batch in {path}")
