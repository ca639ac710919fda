"""Oracle: training steps of the authors' verl fork (complex-reasoning/RPG @ ec8e30bd) on
batches of rollouts fed in (not sampled), in fp32 on the CPU, with the fork's own functions:

  old log-probs   dp_actor.compute_log_prob (logits / temperature, the fork's
                  logprobs_from_logits) at the step's starting weights
  ref             = old log-probs under use_iterative_ref_model (dp_actor.py:316-318,
                  rpg_ray_trainer.py); else the initial weights (the reference worker)
  in-reward KL    ray_trainer.apply_kl_penalty with kl_penalty = actor.kl_loss_type
                  (rpg_ray_trainer.py:195-199): scores - beta * kl_penalty(old, ref) * mask
  advantages      core_algos.compute_{grpo,rpg}_outcome_advantage (uid = group_index)
  layout          W = case["world"] data-parallel ranks: with case["balance"] the fork's own
                  RayPPOTrainer._balance_batch reorders the rows, rank r takes the r-th equal
                  chunk, and each optimizer step sums every rank's mini-batch with FSDP's mean
                  (each rank's loss / W)
  update          dp_actor.update_policy transcribed (lines 257-372), per rank: mini-batches =
                  batch.split(ppo_mini_batch_size * n // W), micro-batches = split(micro) or, with
                  use_dynamic_bsz, rearrange_micro_batches (k = ceil(tokens / max_token_len),
                  verl's get_seqlen_balanced_partitions); per micro-batch the loss of
                  fork_modules.dp_actor_loss (compute_policy_loss, agg_loss, kl_penalty, the
                  micro-batch weight); clip_grad_norm_; torch.optim.AdamW (or, with
                  optim_type=schedulefree, schedulefree.AdamWScheduleFree(lr, betas,
                  weight_decay) as fsdp_workers.py:278-285) with the LambdaLR of fsdp_workers
                  (the fork's get_constant/cosine_schedule_with_warmup), stepped once per
                  training step (fsdp_workers.py:493).
  schedule-free   the optimizer's eval() before the old log-probs (dp_actor.py:205-208) and
                  train() before the update (dp_actor.py:259-262), each in the fork's bare
                  try/except (AdamW has neither): old log-probs at x, the update at y; the
                  weights returned are the live ones after the update, y (what the fork's
                  checkpoint, hf_model included, holds).
  model           transformers' Qwen2 with attn_implementation="sdpa" (transformers' default;
                  the fork trains with flash_attention_2, which has no CPU kernel).

Every training step s is run from rpg's own state at its start, so that each step is compared
at the same bound as the first (no carried-over rounding): step 0 from the model directory's
weights and a fresh optimizer; step s >= 1 from "start.<name>" (rpg's weights) and "state.<key>"
(rpg's optimizer state, loaded into the fork's optimizer: AdamW's step/exp_avg/exp_avg_sq,
schedulefree's z/exp_avg_sq and its group's k/weight_sum/lr_max/train_mode) of its batch file,
the LambdaLR stepped s times beyond the case's first step. Three runs per step:
  own      the fork's step as is (its own old log-probs, advantages, gradients, optimizer);
  inject   no optimizer: the gradient of each optimizer step k at rpg's weights before it
           ("before.<k>.<name>") with rpg's old log-probs / reference / advantages, so that
           gradients are compared at the same point;
  replay   the fork's optimizer loop (clip, AdamW or schedulefree with eval/train, LambdaLR)
           on rpg's own gradients ("rg.<k>.<name>") instead of its forward/backward: the
           optimizer side alone.

Nothing of the fork is edited: core_algos and torch_functional are loaded by fork_modules.

The case is the fork's config as the script's execution hands it over: the script run with
bash and a stub `ray` (fork_scripts.argv), its overrides followed by the test's own
(OVERRIDES.json: the keys the test changed to fit a tiny model on a CPU, the same strings rpg
was given), composed over the fork's rpg_trainer.yaml (fork_scripts.compose). Nothing of it
comes from rpg's resolved config: settings (clip ratios, schedule and warm-up, estimator, the
number of ranks, balance_batch, token budget, filtering, ...) are read from that composed
config, the model from its actor_rollout_ref.model.path, the step count from its data files.

  dynamic sampling  with algorithm.filter_groups.enable, the generation loop of
                  rpg_ray_trainer.fit transcribed (lines 219-259): per generation batch the
                  groups whose metric has std > 0 (np.std) are kept and concatenated until
                  train_batch_size groups are in, then the batch is cut to train_batch_size * n
                  rows; run on rpg's recorded rounds ("gen.acc.<r>": every response's acc), it
                  gives the rounds the fork consumes and the (round, position) of each group
                  it trains on ("kept.<s>"), for the test to hold rpg's choice against.
  advantages      on the batch in the order the fork computes them: after _balance_batch's
                  reorder (ray_trainer.py: balance, then old log-probs, then compute_advantage),
                  returned in the batch's own order.
  chain           besides the per-step runs below, the fork's whole run over every step from
                  the model directory, carrying its own weights, optimizer and LambdaLR (its own
                  old log-probs and advantages on the fed rollouts): "c.<s>.<name>", for the
                  test to check the drift of rpg's chained steps.

usage: train_fork_step.py FORK_DIR SCRIPT.sh OVERRIDES.json STEP0.safetensors[,STEP1...] OUT.safetensors
One batch file per training step (the rollouts of that step and rpg's record of it), in order.
OUT, for every step s (from 0): "w.<s>.<name>" the weights after the fork's own step;
"old_log_probs.<s>", "advantages.<s>", "token_level_rewards.<s>"; "grad_norm.<s>" (one per
optimizer step); "g.<s>.<k>.<name>" the accumulated gradient of optimizer step k before
clipping (inject); "r.<s>.<name>" the weights after the replay; "c.<s>.<name>" the chain's
weights; "kept.<s>" [groups, 2] and "rounds.<s>"; "sw.<s>.<r>.<name>" the weights generation
round r samples with; and "total_steps" (len(dataloader) x
total_epochs, or trainer.total_training_steps).
"""
import json
import math
import sys

import numpy as np
import torch
from safetensors.torch import load_file, save_file

import fork_modules

fork_dir, script, overrides_path, batch_path, out_path = sys.argv[1:6]
torch.manual_seed(0)
core_algos = fork_modules.core_algos(fork_dir)
verl_F = core_algos.verl_F  # the fork's torch_functional

import pyarrow.parquet as pq  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402
from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions  # noqa: E402
from tensordict import TensorDict  # noqa: E402
from verl import DataProto  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import fork_scripts  # noqa: E402

cfg = fork_scripts.compose(fork_dir, fork_scripts.argv(script) + json.load(open(overrides_path)))


def fork_case(cfg):
    """The settings the fork's workers and trainer read, from the composed config (the
    fork's defaults where the script is silent, its normalisations applied)."""
    data, alg, trainer = cfg["data"], cfg["algorithm"], cfg["trainer"]
    actor, rollout = cfg["actor_rollout_ref"]["actor"], cfg["actor_rollout_ref"]["rollout"]
    optim = actor["optim"]
    world = trainer["n_gpus_per_node"] * trainer["nnodes"]
    sp = actor.get("ulysses_sequence_parallel_size", 1)
    # ray_trainer.py:456-499: the dataloader's batch is gen_batch_size prompts, drop_last
    gen_batch = data.get("gen_batch_size") or data["train_batch_size"]
    files = data["train_files"] if isinstance(data["train_files"], list) else [data["train_files"]]
    prompts = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    total_steps = (prompts // gen_batch) * trainer["total_epochs"]
    if trainer.get("total_training_steps") is not None:
        total_steps = trainer["total_training_steps"]
    # fsdp_workers.py:297-302
    warmup = int(optim.get("lr_warmup_steps", -1))
    if warmup < 0:
        warmup = int(optim.get("lr_warmup_steps_ratio", 0.0) * total_steps)
    # fsdp_workers.py:117-128: per-rank mini-batch rows, micro-batch size per GPU
    micro_size = actor.get("ppo_micro_batch_size_per_gpu")
    if actor.get("ppo_micro_batch_size") is not None:
        micro_size = actor["ppo_micro_batch_size"] // (world // sp)
    clip_ratio = actor["clip_ratio"]
    fg = alg.get("filter_groups") or {}
    ref = cfg["actor_rollout_ref"].get("ref") or {}
    return {
        "model_path": cfg["actor_rollout_ref"]["model"]["path"],
        "temperature": rollout["temperature"], "n": rollout["n"],
        "train_batch_size": data["train_batch_size"],
        "filter": bool(fg.get("enable", False)), "filter_metric": fg.get("metric"),
        "max_num_gen_batches": fg.get("max_num_gen_batches", 0),
        "use_kl_in_reward": alg["use_kl_in_reward"], "kl_coef": alg["kl_ctrl"]["kl_coef"],
        "kl_loss_type": actor["kl_loss_type"], "adv_estimator": alg["adv_estimator"], "gamma": alg["gamma"],
        "lr": optim["lr"], "optim_type": optim.get("optim_type", "adamw"),
        "betas": optim.get("betas", (0.9, 0.999)), "weight_decay": optim.get("weight_decay", 1e-2),
        "scheduler": optim.get("warmup_style", "constant"), "warmup": warmup, "total_steps": total_steps,
        "step": 1,
        "mini_rows": actor["ppo_mini_batch_size"] * rollout["n"], "world": world // sp,
        "balance": trainer.get("balance_batch", True),
        "use_dynamic_bsz": actor["use_dynamic_bsz"], "max_token_len": actor["ppo_max_token_len_per_gpu"],
        "micro_size": micro_size, "ppo_epochs": actor["ppo_epochs"],
        "clip_ratio": clip_ratio,
        "clip_ratio_low": actor["clip_ratio_low"] if actor.get("clip_ratio_low") is not None else clip_ratio,
        "clip_ratio_high": actor["clip_ratio_high"] if actor.get("clip_ratio_high") is not None else clip_ratio,
        "clip_ratio_c": actor.get("clip_ratio_c", 3.0), "loss_agg_mode": actor["loss_agg_mode"],
        "entropy_coeff": actor["entropy_coeff"], "use_kl_loss": actor["use_kl_loss"],
        "kl_loss_coef": actor["kl_loss_coef"], "use_iterative_ref_model": actor.get("use_iterative_ref_model", False),
        "grad_clip": actor["grad_clip"],
        # fsdp_workers.py:167-169 (model_dtype: fp32 for the actor, bf16 for the reference)
        # and 227-237 (MixedPrecision: param_dtype bf16 unless fsdp_config.mixed_precision says).
        "param_dtype": param_dtype(actor), "ref_param_dtype": param_dtype(ref),
        "ref_model_dtype": dtype_of((ref.get("fsdp_config") or {}).get("model_dtype") or "bf16"),
    }


def dtype_of(name):
    """verl.utils.torch_dtypes.PrecisionType.to_dtype for the names used here."""
    table = {"fp32": torch.float32, "float32": torch.float32, "32": torch.float32,
             "bf16": torch.bfloat16, "bfloat16": torch.bfloat16}
    if str(name) not in table:
        raise SystemExit(f"dtype {name!r} not in this oracle")
    return table[str(name)]


def param_dtype(section):
    mp = (section.get("fsdp_config") or {}).get("mixed_precision")
    return dtype_of(mp.get("param_dtype", "bf16") if mp is not None else "bf16")


case = fork_case(cfg)
model_dir = case["model_path"]
balance_batch = fork_modules.balance_batch(fork_dir)

# The fp32 master weights (what the optimizer steps) and, under bf16 mixed precision, the
# bf16 copy FSDP computes with: every forward casts the masters (FSDP's unshard at
# param_dtype), every backward's bf16 gradients are cast to fp32 (reduce_dtype) and summed
# into the masters' (the sharded fp32 gradient accumulates across micro-batches). Buffers
# (the rotary inv_freq) stay fp32 (buffer_dtype).
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
model.train()
low = None
if case["param_dtype"] != torch.float32 or (case["ref_param_dtype"] != torch.float32 and
                                            (case["use_kl_loss"] or case["use_kl_in_reward"])):
    low = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16, attn_implementation="sdpa")
    low.train()
    with torch.no_grad():
        for (name, buf), (_, master_buf) in zip(low.named_buffers(), model.named_buffers()):
            if buf.is_floating_point():
                buf.data = master_buf.detach().clone()
batches = [load_file(path) for path in batch_path.split(",")]
temperature = case["temperature"]
initial = {name: prm.detach().clone() for name, prm in model.named_parameters()}
# The reference worker's weights: the checkpoint at its model_dtype (bf16 by default).
ref_weights = {name: w.to(case["ref_model_dtype"]).to(torch.float32) for name, w in initial.items()}
params = dict(model.named_parameters())
needs_ref = case["use_kl_loss"] or case["use_kl_in_reward"]


def set_weights(weights):
    with torch.no_grad():
        for name, prm in model.named_parameters():
            prm.copy_(weights[name])


def computing(dtype):
    """The module a forward at `dtype` runs: the masters (fp32) or the bf16 copy, cast from
    them now."""
    if dtype == torch.float32:
        return model
    with torch.no_grad():
        for (name, w), (_, master) in zip(low.named_parameters(), model.named_parameters()):
            w.copy_(master)
    return low


def move_grads(net):
    """The bf16 copy's gradients, cast to fp32, into the masters' (FSDP's reduce_dtype)."""
    if net is model:
        return
    for (name, w), (_, master) in zip(net.named_parameters(), model.named_parameters()):
        if w.grad is None:
            continue
        g = w.grad.to(torch.float32)
        master.grad = g if master.grad is None else master.grad + g
        w.grad = None


def forward(net, b, rows, calculate_entropy):
    """dp_actor._forward_micro_batch without rmpad: (entropy, log_probs) of the rows. In bf16
    the logits are bf16 and the fork's log-probs come from flash-attn's cross entropy, which
    works in fp32 on them: here the fork's own fp32 path on the bf16 logits cast up."""
    R = b["responses"].size(1)
    out = net(input_ids=b["input_ids"][rows], attention_mask=b["attention_mask"][rows],
              position_ids=b["position_ids"][rows], use_cache=False)
    logits = out.logits
    logits.div_(temperature)
    logits = logits[:, -R - 1:-1, :]
    if logits.dtype != torch.float32:
        logits = logits.to(torch.float32)
    log_probs = verl_F.logprobs_from_logits(logits, b["responses"][rows])
    entropy = verl_F.entropy_from_logits(logits) if calculate_entropy else None
    return entropy, log_probs


def all_log_probs(b, dtype):
    with torch.no_grad():
        return forward(computing(dtype), b, torch.arange(b["input_ids"].size(0)), False)[1]


def balanced_order(b):
    """The batch's rows in the order the fork's trainer holds them after
    trainer.balance_batch (its own _balance_batch, with W ranks); identity without."""
    B = b["input_ids"].size(0)
    if not (case.get("balance", False) and WORLD > 1):
        return torch.arange(B)
    data = DataProto(batch=TensorDict({"attention_mask": b["attention_mask"], "row": torch.arange(B)},
                                      batch_size=[B]))
    balance_batch(SimpleNamespace(actor_rollout_wg=SimpleNamespace(world_size=WORLD)), data, metrics={})
    return data.batch["row"].clone()


def old_log_probs_and_advantages(b):
    """compute_log_prob (no grad), ref, the in-reward KL and the advantages of one batch."""
    R = b["responses"].size(1)
    response_mask = b["attention_mask"][:, -R:].to(torch.float32)
    old_log_probs = all_log_probs(b, case["param_dtype"])
    ref_log_prob = None
    if needs_ref:
        if case["use_iterative_ref_model"]:
            ref_log_prob = old_log_probs
        else:  # the reference worker: the initial weights at its own dtypes
            live = {name: prm.detach().clone() for name, prm in model.named_parameters()}
            set_weights(ref_weights)
            ref_log_prob = all_log_probs(b, case["ref_param_dtype"])
            set_weights(live)
    scores = b["token_level_scores"].to(torch.float32)
    if case["use_kl_in_reward"]:
        kld = core_algos.kl_penalty(old_log_probs, ref_log_prob, kl_penalty=case["kl_loss_type"]) * response_mask
        token_level_rewards = scores - case["kl_coef"] * kld
    else:
        token_level_rewards = scores
    # The fork computes the advantages after _balance_batch's reorder: in that row order
    # (group statistics and the batch whitening of rfpp/rfppb sum in it), returned in ours.
    order = balanced_order(b)
    inverse = torch.empty_like(order)
    inverse[order] = torch.arange(order.numel())
    rewards_o, mask_o = token_level_rewards[order], response_mask[order]
    uid = np.array([str(int(g)) for g in b["group_index"][order].tolist()], dtype=object)
    est = case["adv_estimator"]
    if est == "grpo":
        advantages, _ = core_algos.compute_grpo_outcome_advantage(rewards_o, mask_o, uid)
    elif est == "rpg":
        advantages, _ = core_algos.compute_rpg_outcome_advantage(rewards_o, mask_o, uid)
    elif est == "reinforce_plus_plus":
        advantages, _ = core_algos.compute_reinforce_plus_plus_outcome_advantage(rewards_o, mask_o, case["gamma"])
    elif est == "reinforce_plus_plus_baseline":
        advantages, _ = core_algos.compute_reinforce_plus_plus_baseline_outcome_advantage(rewards_o, mask_o, uid)
    else:
        raise SystemExit(f"adv_estimator {est} not in this oracle")
    advantages = advantages[inverse]
    return old_log_probs, ref_log_prob, token_level_rewards, advantages


def schedulefree():
    return case.get("optim_type", "adamw") == "schedulefree"


def make_optimizer(step, b):
    """The fork's optimizer and LambdaLR at training step `step` (0-based within this run): fresh
    at step 0, else loaded with rpg's optimizer state from the step's batch file."""
    if schedulefree():
        import schedulefree as sf
        opt = sf.AdamWScheduleFree(model.parameters(), lr=case["lr"], betas=tuple(case["betas"]),
                                   weight_decay=case["weight_decay"])
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=case["lr"], betas=tuple(case["betas"]),
                                weight_decay=case["weight_decay"])
    if case["scheduler"] == "constant":
        sched = verl_F.get_constant_schedule_with_warmup(opt, num_warmup_steps=case["warmup"])
    else:
        sched = verl_F.get_cosine_schedule_with_warmup(opt, num_warmup_steps=case["warmup"],
                                                       num_training_steps=case["total_steps"])
    for _ in range(case["step"] - 1 + step):  # the scheduler steps once per training step (fsdp_workers.py:493)
        sched.step()
    if step > 0:
        st = {k[len("state."):]: v for k, v in b.items() if k.startswith("state.")}
        group = opt.param_groups[0]
        if schedulefree():
            group["k"] = int(st["step"].item())
            group["weight_sum"] = float(st["weight_sum"].item())
            group["lr_max"] = float(st["lr_max"].item())
            group["train_mode"] = bool(st["train_mode"].item())
            for name, prm in params.items():
                opt.state[prm] = {"z": st[f"{name}.z"].clone(), "exp_avg_sq": st[f"{name}.exp_avg_sq"].clone()}
        else:
            for name, prm in params.items():
                opt.state[prm] = {"step": torch.tensor(float(st[f"{name}.step"].item()), dtype=torch.float32),
                                  "exp_avg": st[f"{name}.exp_avg"].clone(),
                                  "exp_avg_sq": st[f"{name}.exp_avg_sq"].clone()}
    return opt, sched


WORLD = case.get("world", 1)                 # trainer.nnodes * trainer.n_gpus_per_node
RANK_MINI = case["mini_rows"] // WORLD       # fsdp_workers.py:117-118: ppo_mini_batch_size * n // W


def micro_batches_of(b, mini):
    """The rows of each micro-batch of one optimizer step, as every rank's update_policy cuts
    its own mini-batch (`mini`: the W ranks' rows), rank by rank."""
    attention_mask = b["attention_mask"]
    out = []
    for rank_rows in mini:
        if case["use_dynamic_bsz"]:
            lengths = attention_mask[rank_rows].sum(dim=1)
            assert case["max_token_len"] >= attention_mask.shape[-1]
            k = math.ceil(lengths.sum().item() / case["max_token_len"])
            parts = get_seqlen_balanced_partitions(lengths.tolist(), k, equal_size=False)
            out += [[rank_rows[i] for i in p] for p in parts]
        else:
            out += [rank_rows[i:i + case["micro_size"]] for i in range(0, len(rank_rows), case["micro_size"])]
    return out


def accumulate(b, micro_batches, old_log_probs, ref_log_prob, advantages):
    """Forward/backward of every micro-batch of one mini-batch into .grad (dp_actor's loop)."""
    R = b["responses"].size(1)
    response_mask = b["attention_mask"][:, -R:].to(torch.float32)
    net = computing(case["param_dtype"])  # the masters do not change within a mini-batch
    for rows in micro_batches:
        rows_t = torch.tensor(rows)
        old = old_log_probs[rows_t]
        ref = None
        if needs_ref:
            ref = old if case["use_iterative_ref_model"] else ref_log_prob[rows_t]
        entropy, log_prob = forward(net, b, rows_t, True)
        loss, _, _ = fork_modules.dp_actor_loss(
            core_algos, case, log_prob, old, advantages[rows_t], response_mask[rows_t], ref, entropy,
            micro_rows=len(rows), mini_rows=RANK_MINI, use_dynamic_bsz=case["use_dynamic_bsz"],
            micro_size=case["micro_size"])
        # FSDP averages the ranks' gradients: the same mean, formed in one process.
        (loss / WORLD if WORLD > 1 else loss).backward()
        move_grads(net)


def mini_batches(b):
    """Every optimizer step's rows, one list per rank: with balance, the fork's own
    _balance_batch reorders the rows; rank r takes the r-th equal chunk (DataProto.chunk) and
    splits it into mini-batches of RANK_MINI rows (batch.split(ppo_mini_batch_size))."""
    B = b["input_ids"].size(0)
    order = balanced_order(b).tolist()
    assert B % WORLD == 0
    per_rank = B // WORLD
    for _ in range(case["ppo_epochs"]):
        for start in range(0, per_rank, RANK_MINI):
            yield [order[r * per_rank + start:r * per_rank + min(per_rank, start + RANK_MINI)] for r in range(WORLD)]


def train_step(s, b, replay):
    """One training step of the fork from the step's starting state. replay: every optimizer
    step k takes rpg's recorded gradient rg.<k> instead of the fork's forward/backward."""
    set_weights(initial if s == 0 else {name: b[f"start.{name}"] for name in params})
    opt, sched = make_optimizer(s, b)
    return step_with(opt, sched, b, replay)


def step_with(opt, sched, b, replay):
    """The step itself on the live weights, optimizer and LambdaLR (left as the fork leaves them)."""
    try:  # dp_actor.compute_log_prob (lines 205-208)
        opt.eval()
    except AttributeError:
        pass
    old_log_probs, ref_log_prob, token_level_rewards, advantages = old_log_probs_and_advantages(b)
    try:  # dp_actor.update_policy (lines 259-262)
        opt.train()
    except AttributeError:
        pass
    grad_norms = []
    for k, mini in enumerate(mini_batches(b)):
        opt.zero_grad()
        if replay:
            for name, prm in params.items():
                prm.grad = b[f"rg.{k}.{name}"].clone()
        else:
            accumulate(b, micro_batches_of(b, mini), old_log_probs, ref_log_prob, advantages)
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=case["grad_clip"])
        grad_norms.append(float(grad_norm))
        if torch.isfinite(grad_norm):
            opt.step()
        else:
            opt.zero_grad()
    opt.zero_grad()
    sched.step()
    weights = {name: prm.detach().clone().contiguous() for name, prm in params.items()}
    return weights, grad_norms, (old_log_probs, advantages, token_level_rewards)


def chain(batches):
    """The fork's run over all the steps from the model directory: one optimizer and LambdaLR,
    its own weights carried from step to step."""
    set_weights(initial)
    opt, sched = make_optimizer(0, batches[0])
    return [step_with(opt, sched, b, replay=False)[0] for b in batches]


def sampling_weights(s, b):
    """The weights each generation round of step s samples with (rpg_ray_trainer.fit): the live
    ones; with use_kl_in_reward every round's compute_log_prob calls optimizer.eval() (lines
    132-134, dp_actor.py:205-208) and the next round follows without train(), so with
    schedule-free rounds 2..k sample at x. One entry per round rpg recorded."""
    set_weights(initial if s == 0 else {name: b[f"start.{name}"] for name in params})
    opt, _ = make_optimizer(s, b)
    out = []
    for _ in range(sum(1 for k in b if k.startswith("gen.acc."))):
        out.append({name: prm.detach().clone().contiguous() for name, prm in params.items()})
        if case["use_kl_in_reward"]:
            try:
                opt.eval()
            except AttributeError:
                pass
    return out


def dynamic_sampling(b):
    """rpg_ray_trainer.fit's generation loop (lines 82-88, 219-259) on rpg's recorded rounds:
    (the rounds the fork generates, [(round, position)] of the groups it trains on)."""
    n, want = case["n"], case["train_batch_size"]
    rounds = sorted(int(k.split(".")[2]) for k in b if k.startswith("gen.acc."))
    kept, num_prompt_in_batch, num_gen_batches = [], 0, 0
    for r in rounds:
        num_gen_batches += 1
        acc = b[f"gen.acc.{r}"].to(torch.float64).view(-1, n).numpy()
        if not case["filter"]:
            return num_gen_batches, [(r, g) for g in range(acc.shape[0])]
        assert case["filter_metric"] == "acc", "this oracle records acc only"
        uid_vals = {g: list(acc[g]) for g in range(acc.shape[0])}  # prompt_uid2metric_vals
        kept_uids = [g for g, vals in uid_vals.items() if np.std(vals) > 0 or len(vals) == 1]
        num_prompt_in_batch += len(kept_uids)
        kept += [(r, g) for g in kept_uids]
        if num_prompt_in_batch < want:
            if case["max_num_gen_batches"] <= 0 or num_gen_batches < case["max_num_gen_batches"]:
                continue
            raise SystemExit(f"the fork raises: {num_gen_batches=} >= max_num_gen_batches")
        return num_gen_batches, kept[:want]  # batch[:traj_bsz]: whole groups of n rows
    raise SystemExit(f"rpg recorded {len(rounds)} generation rounds; the fork needs more")


def gradients_at_rpgs_weights(b):
    """inject: the accumulated gradient of each optimizer step at rpg's weights before it, with
    rpg's old log-probs, reference and advantages."""
    grads = {}
    old = b["old_log_probs"]
    ref = b.get("ref_log_probs", old)
    for k, mini in enumerate(mini_batches(b)):
        set_weights({name: b[f"before.{k}.{name}"] for name in params})
        model.zero_grad()
        accumulate(b, micro_batches_of(b, mini), old, ref, b["advantages"])
        for name, prm in params.items():
            if prm.grad is not None:
                grads[f"{k}.{name}"] = prm.grad.detach().clone()
    model.zero_grad()
    return grads


out = {"total_steps": torch.tensor([case["total_steps"]], dtype=torch.int64)}
for s, b in enumerate(batches):
    weights, grad_norms, (old, adv, rewards) = train_step(s, b, replay=False)
    out.update({f"w.{s}.{name}": w for name, w in weights.items()})
    out[f"old_log_probs.{s}"] = old.contiguous()
    out[f"advantages.{s}"] = adv.contiguous()
    out[f"token_level_rewards.{s}"] = rewards.contiguous()
    out[f"grad_norm.{s}"] = torch.tensor(grad_norms, dtype=torch.float64)
    out.update({f"g.{s}.{key}": g for key, g in gradients_at_rpgs_weights(b).items()})
    replayed, _, _ = train_step(s, b, replay=True)
    out.update({f"r.{s}.{name}": w for name, w in replayed.items()})
    for r, weights in enumerate(sampling_weights(s, b)):
        out.update({f"sw.{s}.{r}.{name}": w for name, w in weights.items()})
    if any(k.startswith("gen.acc.") for k in b):
        rounds, kept = dynamic_sampling(b)
        out[f"rounds.{s}"] = torch.tensor([rounds], dtype=torch.int64)
        out[f"kept.{s}"] = torch.tensor(kept, dtype=torch.int64).view(-1, 2)
for s, weights in enumerate(chain(batches)):
    out.update({f"c.{s}.{name}": w for name, w in weights.items()})
save_file(out, out_path)
