"""Oracle: one (or a few) training steps of the authors' verl fork (complex-reasoning/RPG @ ec8e30bd) on a
batch of rollouts fed in (not sampled), in fp32 on the CPU, with the fork's own functions:

  old log-probs   dp_actor.compute_log_prob (logits / temperature, the fork's
                  logprobs_from_logits) with the initial weights
  ref             = old log-probs under use_iterative_ref_model (dp_actor.py:316-318,
                  rpg_ray_trainer.py); else the initial weights (= old at the first step)
  in-reward KL    ray_trainer.apply_kl_penalty with kl_penalty = actor.kl_loss_type
                  (rpg_ray_trainer.py:195-199): scores - beta * kl_penalty(old, ref) * mask
  advantages      core_algos.compute_{grpo,rpg}_outcome_advantage (uid = group_index)
  update          dp_actor.update_policy transcribed (lines 257-372): mini-batches =
                  batch.split(ppo_mini_batch_size * n), micro-batches = split(micro) or, with
                  use_dynamic_bsz, rearrange_micro_batches (k = ceil(tokens / max_token_len),
                  verl's get_seqlen_balanced_partitions); per micro-batch
                  compute_policy_loss - entropy_coeff * agg_loss(entropy) + kl_loss_coef *
                  agg_loss(kl_penalty(log_prob, ref)), times rows / mini (dynamic) or
                  1 / gradient_accumulation; clip_grad_norm_; torch.optim.AdamW (or, with
                  optim_type=schedulefree, schedulefree.AdamWScheduleFree(lr, betas,
                  weight_decay) as fsdp_workers.py:278-285) stepped with the LambdaLR of
                  fsdp_workers (the fork's get_constant/cosine_schedule_with_warmup), which
                  steps once per training step (fsdp_workers.py:493).
  schedule-free   the optimizer's eval() before the old log-probs (dp_actor.py:205-208) and
                  train() before the update (dp_actor.py:259-262), each in the fork's bare
                  try/except (AdamW has neither): old log-probs at x, the update at y; the
                  weights returned are the live ones after the last update, y (what the fork's
                  checkpoint, hf_model included, holds).

Nothing of the fork is edited: core_algos and torch_functional are loaded by fork_modules.

usage: train_fork_step.py FORK_DIR MODEL_DIR CASE.json BATCH.safetensors[,BATCH2...] OUT.safetensors
One batch file per training step (the rollouts of that step), in order.
OUT: "w.<name>" the weights after the last step (named_parameters), "g.<k>.<name>" the
gradient accumulated by optimizer step k of the last training step before clipping (at the
trainer's recorded weights "before.<k>.<name>" of the last batch file), "old_log_probs",
"advantages", "token_level_rewards" of the last step (".<s>" suffixed: of step s, from 0),
"grad_norm" (one per optimizer step, all steps); with "rg.<k>.<name>" in every batch file
(the trainer's gradient of its optimizer step k of that training step, before clipping),
"r.<name>": the weights after the fork's optimizer loop (clip, AdamW or schedulefree with
eval/train, LambdaLR) run on those gradients instead of its own.
"""
import importlib.util
import json
import math
import os
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import fork_modules

fork_dir, model_dir, case_path, batch_path, out_path = sys.argv[1:6]
case = json.load(open(case_path))
torch.manual_seed(0)
core_algos = fork_modules.core_algos(fork_dir)
verl_F = core_algos.verl_F  # the fork's torch_functional

from transformers import AutoModelForCausalLM  # noqa: E402
from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions  # noqa: E402

model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
model.train()
batches = [load_file(path) for path in batch_path.split(",")]
temperature = case["temperature"]


def forward(b, rows, calculate_entropy):
    """dp_actor._forward_micro_batch without rmpad: (entropy, log_probs) of the rows."""
    R = b["responses"].size(1)
    out = model(input_ids=b["input_ids"][rows], attention_mask=b["attention_mask"][rows],
                position_ids=b["position_ids"][rows], use_cache=False)
    logits = out.logits
    logits.div_(temperature)
    logits = logits[:, -R - 1:-1, :]
    log_probs = verl_F.logprobs_from_logits(logits, b["responses"][rows])
    entropy = verl_F.entropy_from_logits(logits) if calculate_entropy else None
    return entropy, log_probs


def old_log_probs_and_advantages(b):
    """compute_log_prob (no grad), ref, the in-reward KL and the advantages of one batch."""
    R = b["responses"].size(1)
    response_mask = b["attention_mask"][:, -R:].to(torch.float32)
    with torch.no_grad():
        _, old_log_probs = forward(b, torch.arange(b["input_ids"].size(0)), False)
    ref_log_prob = old_log_probs  # iterative: old; else the initial policy (= old at step 1 only)
    assert case["use_iterative_ref_model"] or len(batches) == 1, "a fixed reference over several steps: not here"
    scores = b["token_level_scores"].to(torch.float32)
    if case["use_kl_in_reward"]:
        kld = core_algos.kl_penalty(old_log_probs, ref_log_prob, kl_penalty=case["kl_loss_type"]) * response_mask
        token_level_rewards = scores - case["kl_coef"] * kld
    else:
        token_level_rewards = scores
    uid = np.array([str(int(g)) for g in b["group_index"].tolist()], dtype=object)
    if case["adv_estimator"] == "grpo":
        advantages, _ = core_algos.compute_grpo_outcome_advantage(token_level_rewards, response_mask, uid)
    elif case["adv_estimator"] == "rpg":
        advantages, _ = core_algos.compute_rpg_outcome_advantage(token_level_rewards, response_mask, uid)
    else:
        raise SystemExit(f"adv_estimator {case['adv_estimator']} not in this oracle")
    return old_log_probs, ref_log_prob, token_level_rewards, advantages


initial = {name: prm.detach().clone() for name, prm in model.named_parameters()}


def make_optimizer():
    if case.get("optim_type", "adamw") == "schedulefree":
        import schedulefree
        return schedulefree.AdamWScheduleFree(model.parameters(), lr=case["lr"], betas=tuple(case["betas"]),
                                              weight_decay=case["weight_decay"])
    return torch.optim.AdamW(model.parameters(), lr=case["lr"], betas=tuple(case["betas"]),
                             weight_decay=case["weight_decay"])


def update_policy(opt, b, old_log_probs, ref_log_prob, advantages, grad_norms, grads, inject, replay=False):
    """dp_actor.update_policy on one batch. With inject, mini-batch k starts from the trainer's
    recorded weights "before.<k>.<name>" and uses the trainer's old log-probs / reference /
    advantages (so that its gradient is compared at the same point, free of earlier rounding)."""
    B = b["input_ids"].size(0)
    R = b["responses"].size(1)
    attention_mask = b["attention_mask"]
    response_mask = attention_mask[:, -R:].to(torch.float32)
    mini_rows = case["mini_rows"]
    first = len(grad_norms)
    for epoch in range(case["ppo_epochs"]):
        for start in range(0, B, mini_rows):  # batch.split(ppo_mini_batch_size)
            mini = list(range(start, min(B, start + mini_rows)))
            if case["use_dynamic_bsz"]:
                lengths = attention_mask[mini].sum(dim=1)
                assert case["max_token_len"] >= attention_mask.shape[-1]
                k = math.ceil(lengths.sum().item() / case["max_token_len"])
                parts = get_seqlen_balanced_partitions(lengths.tolist(), k, equal_size=False)
                micro_batches = [[mini[i] for i in p] for p in parts]
            else:
                gradient_accumulation = case["mini_rows"] // case["micro_size"]
                micro_batches = [mini[i:i + case["micro_size"]] for i in range(0, len(mini), case["micro_size"])]
            opt.zero_grad()
            if inject:
                with torch.no_grad():
                    for name, prm in model.named_parameters():
                        prm.copy_(b[f"before.{len(grad_norms) - first}.{name}"])
            for rows in ([] if replay else micro_batches):
                rows_t = torch.tensor(rows)
                mask = response_mask[rows_t]
                old = (b["old_log_probs"] if inject else old_log_probs)[rows_t]
                adv = (b["advantages"] if inject else advantages)[rows_t]
                ref_all = b.get("ref_log_probs", b["old_log_probs"]) if inject else ref_log_prob
                ref = old if case["use_iterative_ref_model"] else ref_all[rows_t]
                entropy, log_prob = forward(b, rows_t, True)
                pg_loss, _, _, _ = core_algos.compute_policy_loss(
                    old_log_prob=old, log_prob=log_prob, advantages=adv, response_mask=mask,
                    cliprange=case["clip_ratio"], cliprange_low=case["clip_ratio_low"],
                    cliprange_high=case["clip_ratio_high"], clip_ratio_c=case["clip_ratio_c"],
                    loss_agg_mode=case["loss_agg_mode"])
                entropy_loss = core_algos.agg_loss(loss_mat=entropy, loss_mask=mask, loss_agg_mode=case["loss_agg_mode"])
                policy_loss = pg_loss - entropy_loss * case["entropy_coeff"]
                if case["use_kl_loss"]:
                    kld = core_algos.kl_penalty(logprob=log_prob, ref_logprob=ref, kl_penalty=case["kl_loss_type"])
                    kl_loss = core_algos.agg_loss(loss_mat=kld, loss_mask=mask, loss_agg_mode=case["loss_agg_mode"])
                    policy_loss = policy_loss + kl_loss * case["kl_loss_coef"]
                if case["use_dynamic_bsz"]:
                    loss = policy_loss * (len(rows) / case["mini_rows"])
                else:
                    loss = policy_loss / gradient_accumulation
                loss.backward()
            if replay:  # the trainer's own accumulated gradient of this optimizer step
                for name, prm in model.named_parameters():
                    prm.grad = b[f"rg.{len(grad_norms) - first}.{name}"].clone()
            for name, prm in model.named_parameters():  # the accumulated gradient before clipping
                if prm.grad is not None:
                    grads[f"g.{len(grad_norms) - first}.{name}"] = prm.grad.detach().clone()
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=case["grad_clip"])
            grad_norms.append(float(grad_norm))
            if torch.isfinite(grad_norm):
                opt.step()
            else:
                opt.zero_grad()


def train(inject, replay=False):
    """The fork's training steps from the initial weights (inject: the last batch only;
    replay: every optimizer step takes the trainer's recorded gradient "rg.<k>.<name>" instead
    of the fork's forward/backward, so that the optimizer side is compared alone)."""
    with torch.no_grad():
        for name, prm in model.named_parameters():
            prm.copy_(initial[name])
    opt = make_optimizer()
    if case["scheduler"] == "constant":
        sched = verl_F.get_constant_schedule_with_warmup(opt, num_warmup_steps=case["warmup"])
    else:
        sched = verl_F.get_cosine_schedule_with_warmup(opt, num_warmup_steps=case["warmup"],
                                                       num_training_steps=case["total_steps"])
    for _ in range(case["step"] - 1):  # the scheduler steps once per training step (fsdp_workers.py:493)
        sched.step()
    grad_norms, grads, per_step = [], {}, []
    for b in (batches[-1:] if inject else batches):
        try:  # dp_actor.compute_log_prob (lines 205-208)
            opt.eval()
        except AttributeError:
            pass
        old_log_probs, ref_log_prob, token_level_rewards, advantages = old_log_probs_and_advantages(b)
        per_step.append((old_log_probs, advantages, token_level_rewards))
        try:  # dp_actor.update_policy (lines 259-262)
            opt.train()
        except AttributeError:
            pass
        if inject:
            grad_norms = []
            grads = {}
        update_policy(opt, b, old_log_probs, ref_log_prob, advantages, grad_norms, grads, inject, replay)
        opt.zero_grad()
        sched.step()
    weights = {name: prm.detach().clone().contiguous() for name, prm in model.named_parameters()}
    return weights, grads, grad_norms, per_step


weights, _, grad_norms, per_step = train(inject=False)
_, grads, _, _ = train(inject=True) if any(k.startswith("before.") for k in batches[-1]) else ({}, {}, [], [])

replayed, _, _, _ = train(inject=False, replay=True) if any(k.startswith("rg.") for k in batches[-1]) else ({}, 0, 0, 0)

out = {f"w.{name}": w for name, w in weights.items()}
out.update({f"r.{name}": w for name, w in replayed.items()})
for s, (old, adv, rewards) in enumerate(per_step):
    out[f"old_log_probs.{s}"] = old.contiguous()
    out[f"advantages.{s}"] = adv.contiguous()
    out[f"token_level_rewards.{s}"] = rewards.contiguous()
out["old_log_probs"], out["advantages"], out["token_level_rewards"] = (t.clone() for t in per_step[-1])
out["grad_norm"] = torch.tensor(grad_norms, dtype=torch.float64)
out.update(grads)
save_file(out, out_path)
