#!/usr/bin/env python3
"""Generates recipes/fork/*.yaml (one per run script of the authors' fork) and
docs/fork-vs-paper.md (one row per script: what the fork's code optimises vs what the paper
describes) from the 60 scripts themselves. Each script is executed by bash with a stub `ray`
that records what it submits (tests/oracles/fork_scripts.py), so the overrides are bash's own;
each one is either a key of the recipe (MAPPED, same name and value) or a NO_EFFECT entry named
in the recipe's header with its reason. An override in neither is an error: nothing is dropped
silently. kl_penalty values come from the fork's own core_algos.

usage: scripts/fork_recipes.py [--fork-dir DIR] [--check]
  --fork-dir  the authors' fork (default: rpg-fork-ec8e30bd next to the venv, as
              scripts/setup.sh provisions it)
  --check     regenerate in memory and compare with the checked-in files; exit 1 on any
              difference (CTest: fork_recipes.up_to_date)
"""
import argparse
import os
import re
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests", "oracles"))
import fork_modules  # noqa: E402
import fork_scripts  # noqa: E402

COMMIT = "ec8e30bdc6f81ffe2590ab7b3d99789b73e07367"


def default_fork_dir():
    venv = os.path.realpath(os.path.join(REPO, ".venv"))
    return os.path.join(os.path.dirname(venv), "rpg-fork-" + COMMIT[:8])


# ---- where each override goes -------------------------------------------------------------
# Overrides that rpg reads under the same name: they go into the recipe one-to-one. Paths (data
# files, model, run directory) stay as the script computes them from the fork's checkout.
MAPPED = {
    "data." + k for k in ("train_files", "val_files", "prompt_key", "truncation", "max_prompt_length",
                          "max_response_length", "gen_batch_size", "train_batch_size")
} | {
    "actor_rollout_ref.actor." + k for k in (
        "use_kl_loss", "kl_loss_coef", "kl_loss_type", "use_iterative_ref_model", "clip_ratio_low",
        "clip_ratio_high", "clip_ratio_c", "use_dynamic_bsz", "ppo_max_token_len_per_gpu", "ppo_mini_batch_size",
        "ppo_micro_batch_size", "entropy_coeff", "grad_clip", "loss_agg_mode", "optim.lr", "optim.optim_type",
        "optim.lr_warmup_steps", "optim.weight_decay")
} | {
    "actor_rollout_ref.model." + k for k in ("path", "use_remove_padding", "enable_gradient_checkpointing")
} | {
    "actor_rollout_ref.rollout." + k for k in (
        "n", "temperature", "top_p", "top_k", "enforce_eager", "max_num_batched_tokens", "val_kwargs.temperature",
        "val_kwargs.top_p",
        "val_kwargs.top_k", "val_kwargs.do_sample", "val_kwargs.n")
} | {
    "algorithm." + k for k in ("adv_estimator", "use_kl_in_reward", "kl_ctrl.kl_coef", "filter_groups.enable",
                               "filter_groups.metric", "filter_groups.max_num_gen_batches")
} | {
    "reward_model." + k for k in ("reward_manager", "overlong_buffer.enable", "overlong_buffer.len",
                                  "overlong_buffer.penalty_factor")
} | {
    # n_gpus_per_node / nnodes: rpg checks them against its launcher when more than one process
    # runs; a one-process run does not lay the batch out over 8 ranks as the fork does.
    "trainer." + k for k in ("n_gpus_per_node", "nnodes", "val_before_train",
                             "test_freq", "save_freq", "total_epochs", "default_local_dir", "resume_mode",
                             "max_actor_ckpt_to_keep")
}

# Overrides that change nothing rpg computes, by entry: (name, why, keys). A key ending in `.`
# covers its subtree. rpg's loader accepts each and has no setting of that name.
NO_EFFECT = [
    ("vllm", "vLLM engine settings (memory, tensor parallelism, turning chunked prefill on, cache release); rpg "
             "generates with its own in-process engine, which always prefills a prompt past "
             "max_num_batched_tokens in chunks",
     ["actor_rollout_ref.rollout." + k for k in ("gpu_memory_utilization", "tensor_model_parallel_size",
                                                 "enable_chunked_prefill", "free_cache_engine")]),
    ("old_log_prob_micro_batching", "micro-batching of the fork's no-grad old log-prob pass; rpg cuts that pass "
                                    "like the actor's update (actor.use_dynamic_bsz, ppo_max_token_len_per_gpu), "
                                    "which changes no log-prob beyond float rounding",
     ["actor_rollout_ref.rollout." + k for k in ("log_prob_micro_batch_size", "log_prob_use_dynamic_bsz",
                                                 "log_prob_max_token_len_per_gpu")]),
    ("ref_worker", "the fork's reference worker (its micro-batching, FSDP offload, sequence parallelism); rpg's "
                   "reference pass takes the actor's settings, and micro-batching changes no log-prob beyond "
                   "float rounding",
     ["actor_rollout_ref.ref."]),
    ("fsdp", "FSDP sharding and offload and Ulysses sequence parallelism (1: none): how verl lays the model over "
             "the GPUs, not what it computes; rpg keeps whole weights in each process",
     ["actor_rollout_ref.actor.fsdp_config.", "actor_rollout_ref.actor.ulysses_sequence_parallel_size"]),
    ("hf_override_config", "dropout set to 0 in the HF config; rpg's models have no dropout",
     ["actor_rollout_ref.model.override_config."]),
    ("critic", "the fork builds no critic for the grpo, rpg and reinforce_plus_plus[_baseline] advantage "
               "estimators (verl/trainer/ppo/ray_trainer.py:304-309); rpg trains none",
     ["critic."]),
    ("logger", "console and wandb logging and its project / experiment names; rpg writes metrics.jsonl and "
               "TensorBoard events in the run directory (trainer.default_local_dir)",
     ["trainer.logger", "trainer.project_name", "trainer.experiment_name"]),
]


def bare(key):
    return key.lstrip("+~")


def no_effect_entry(key):
    for name, why, keys in NO_EFFECT:
        if any(bare(key).startswith(k) if k.endswith(".") else bare(key) == k for k in keys):
            return name, why
    return None


def place(path, argv):
    """Splits a script's overrides into (the recipe's key -> value, {entry name: (why, [override])})."""
    mapped, dropped = {}, {}
    for arg in argv:
        key, value = fork_scripts.split(arg)
        entry = no_effect_entry(key)
        if bare(key) in MAPPED and entry is None:
            if mapped.get(bare(key), value) != value:
                raise SystemExit(f"error: {path}: {bare(key)} given twice with different values")
            mapped[bare(key)] = value
        elif entry is not None and bare(key) not in MAPPED:
            dropped.setdefault(entry[0], (entry[1], []))
            if arg not in dropped[entry[0]][1]:
                dropped[entry[0]][1].append(arg)
        else:
            where = "both a recipe key (MAPPED) and" if entry else "neither a recipe key (MAPPED) nor"
            raise SystemExit(f"error: {path}: override {arg} is {where} listed without effect (NO_EFFECT) "
                             "in scripts/fork_recipes.py")
    return mapped, dropped


# ---- values ----------------------------------------------------------------------------
def typed(v):
    if v in ("True", "true"):
        return True
    if v in ("False", "false"):
        return False
    if v in ("null", "None", "~"):
        return None
    if v.startswith("[") and v.endswith("]"):
        inner = v[1:-1].strip()
        return [typed(x.strip()) for x in inner.split(",")] if inner else []
    if re.fullmatch(r"[+-]?\d+", v):
        return int(v)
    if re.fullmatch(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?", v):
        return float(v)
    return v


def yaml_scalar(v):
    if v is True:
        return "true"
    if v is False:
        return "false"
    if v is None:
        return "null"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, int):
        return str(v)
    if isinstance(v, list):
        return "[" + ", ".join(yaml_scalar(x) for x in v) + "]"
    if re.fullmatch(r"[A-Za-z0-9_./@-]+", v) and typed(v) == v and v not in ("yes", "no", "on", "off"):
        return v
    return "'" + v.replace("'", "''") + "'"


def nested(ov):
    root = {}
    for key, value in ov.items():
        parts = key.lstrip("+").split(".")
        node = root
        for p in parts[:-1]:
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise SystemExit(f"key {key}: {p} is both a value and a section")
        if parts[-1] in node:
            if node[parts[-1]] != typed(value):
                raise SystemExit(f"key {key} given twice with different values")
            continue
        node[parts[-1]] = typed(value)
    return root


def dump(node, indent=0):
    lines = []
    for k, v in node.items():
        if isinstance(v, dict):
            lines.append(" " * indent + f"{k}:")
            lines.extend(dump(v, indent + 2))
        else:
            lines.append(" " * indent + f"{k}: {yaml_scalar(v)}")
    return lines


# ---- what the fork's code computes -------------------------------------------------------
ADV = {
    "rpg": "group-mean advantage (R - mean of the group)",
    "rpg_batchmean": "batch-mean advantage",
    "grpo": "group-normalised advantage ((R - mean) / std)",
    "reinforce_plus_plus": "REINFORCE++ return, whitened over the batch",
    "reinforce_plus_plus_baseline": "group-mean baseline, whitened over the batch",
}


class Fork:
    def __init__(self, fork_dir):
        import torch

        self.torch = torch
        self.core = fork_modules.core_algos(fork_dir)

    def at_w1(self, form):
        """kl_penalty(x, x, form): its value when log_prob == ref (w = 1)."""
        z = self.torch.zeros(1, dtype=self.torch.float64)
        return float(self.core.kl_penalty(z, z, form)[0])


def get(ov, key, default):
    return ov.get(key, ov.get("+" + key, default))


def fork_summary(ov, fork):
    a = "actor_rollout_ref.actor."
    s = fork_scripts.loss_setting(ov)
    adv = get(ov, "algorithm.adv_estimator", "gae")
    ref = "pi_old (use_iterative_ref_model)" if s["use_iterative_ref_model"] else "the initial policy"
    parts = [f"PPO dual-clip (eps = ({s['clip_ratio_low']:g}, {s['clip_ratio_high']:g}), c = {s['clip_ratio_c']:g})",
             ADV.get(adv, adv)]
    if s["use_kl_loss"] and s["kl_loss_coef"] > 0:
        parts.append(f"+ {s['kl_loss_coef']:g} * token-mean {s['kl_loss_type']}(pi_theta, {ref}) outside the clip")
    else:
        parts.append(f"no KL loss (use_kl_loss={get(ov, a + 'use_kl_loss', 'False')})")
    kl_coef = float(get(ov, "algorithm.kl_ctrl.kl_coef", "0.001"))
    if get(ov, "algorithm.use_kl_in_reward", "False") == "True":
        if kl_coef == 0:
            parts.append("in-reward KL with kl_coef = 0: none")
        else:
            form = s["kl_loss_type"]
            if s["use_iterative_ref_model"]:
                v = fork.at_w1(form)
                parts.append(f"reward -= {kl_coef:g} * {form}(pi_old, pi_old) = {kl_coef * v:g} per response token"
                             + (": a length penalty" if v > 0 else ": a length bonus" if v < 0 else ""))
            else:
                parts.append(f"reward -= {kl_coef:g} * {form}(pi_old, initial policy) per token")
    lr = get(ov, a + "optim.lr", "1e-6")
    opt = get(ov, a + "optim.optim_type", "adamw")
    warm = get(ov, a + "optim.lr_warmup_steps", "-1")
    parts.append(f"{opt} lr {lr}, {warm} warm-up steps")
    return "; ".join(parts)


def paper_summary(stem):
    m = re.match(r"run_rpg_7b_(fkl|rkl|ufkl|urkl)1e-4(.*)$", stem)
    if m:
        kl, rest = m.group(1).upper(), m.group(2)
        if rest.startswith("_rf_clip_ppo"):
            c = re.match(r"_rf_clip_ppo_([\d.]+)_([\d.]+)", rest)
            eps = f"eps = ({c.group(1)}, {c.group(2)})" if c else "eps = (0.2, 0.28), Appendix H"
            return f"RPG-REINFORCE-{kl} with RPG-Style Clip (Algorithm 2, {eps}), beta = 1e-4"
        if rest.startswith("_rf"):
            return f"RPG-REINFORCE-{kl} (Table 2 / Appendix F, no clip), beta = 1e-4"
        return f"RPG-{kl}: differentiable surrogate (Table {'1' if kl.startswith('U') else '4'}) with RPG-Style Clip (Algorithm 1), beta = 1e-4"
    if stem.startswith("run_rpg_7b_schedulefree"):
        return "RPG (the script name gives no KL form; beta not stated)"
    if stem.startswith("run_grpo"):
        return "GRPO (Section 2.2): PPO clip + beta * k3 KL to the reference, group-normalised advantage"
    if stem.startswith("run_dapo"):
        return "DAPO: clip-higher (0.2, 0.28), token-mean, dynamic sampling, overlong shaping, no KL"
    if stem.startswith("run_rfppb"):
        return "REINFORCE++-baseline: group-mean baseline, batch whitening, KL (beta = 1e-4) in the reward (App. C.2)"
    if stem.startswith("run_rfpp"):
        return "REINFORCE++: KL (beta = 1e-4) folded into the token reward, whitened returns (App. C.2)"
    return "?"


def paper_recipe(stem, ov):
    """The recipes/ (paper mode) file for this cell of the matrix, if one exists."""
    sf = "_schedule_free" if get(ov, "actor_rollout_ref.actor.optim.optim_type", "adamw") == "schedulefree" else ""
    m = re.match(r"run_rpg_7b_(fkl|rkl|ufkl|urkl)1e-4(.*)$", stem)
    name = None
    if m and m.group(2).startswith("_rf_clip_ppo"):
        s = fork_scripts.loss_setting(ov)
        name = f"rpg_reinforce_{m.group(1)}_clip_{s['clip_ratio_low']:g}_{s['clip_ratio_high']:g}{sf}.yaml"
    elif m and not m.group(2).startswith("_rf"):
        name = f"rpg_{m.group(1)}.yaml"
    else:
        for base in ("rfppb", "rfpp", "grpo", "dapo"):
            if stem.startswith(f"run_{base}_"):
                name = f"{base}.yaml"
                break
    if name and os.path.exists(os.path.join(REPO, "recipes", name)):
        if sf and "_schedule_free" not in name:
            return f"`{name}` (AdamW; schedule-free by override)"
        return f"`{name}`"
    return "none"


# ---- outputs ---------------------------------------------------------------------------
def generate(fork_dir):
    fork = Fork(fork_dir)
    files = {}
    rows = []
    used = {}
    for path in fork_scripts.scripts(fork_dir):
        stem = os.path.basename(path)[:-3]
        try:
            argv = fork_scripts.argv(path)
        except ValueError as e:
            raise SystemExit(f"error: {e}")
        ov, dropped = place(f"recipe/rpg/7b/{stem}.sh", argv)
        summary = fork_summary(ov, fork)
        head = [
            "# Generated by scripts/fork_recipes.py -- edit that script, not this file.",
            f"# The authors' run script recipe/rpg/7b/{stem}.sh (complex-reasoning/RPG @ {COMMIT[:8]}),",
            "# executed by bash with a stub `ray` (from the fork's checkout, nothing exported): each Hydra override",
            "# it submits is a key below with bash's value, or listed under \"no effect in rpg\".",
            f"# fork semantics: {summary}",
            "# rpg.semantics: auto selects fork semantics (reward_manager=rpg, the fork's spellings); the reward is",
            "# the fork's math_dapo (no \\boxed{} fallback): reward_model.reward_kwargs.dapo_variant defaults to math_dapo_fork.",
            "# no effect in rpg (left out of this file):",
        ]
        for name, (why, args) in dropped.items():
            head.extend(textwrap.wrap(f"{name}: {why}", 100, initial_indent="#   ", subsequent_indent="#     "))
            head.extend(f"#       {a}" for a in args)
            used[name] = used.get(name, 0) + 1
        files[os.path.join("recipes", "fork", stem + ".yaml")] = "\n".join(head + dump(nested(ov))) + "\n"
        rows.append(f"| `{stem}.sh` | {summary} | {paper_summary(stem)} | {paper_recipe(stem, ov)} | `fork/{stem}.yaml` |")
    doc = [
        "# The authors' run scripts: what their code optimises vs what the paper describes",
        "",
        "Generated by `scripts/fork_recipes.py` from the 60 scripts of the authors' verl fork",
        f"(complex-reasoning/RPG @ {COMMIT[:8]}, `recipe/rpg/7b/`); do not edit by hand.",
        "",
        "How the fork's code reads each script (`dp_actor.update_policy`, `core_algos.py`,",
        "`rpg_ray_trainer.py`): the actor loss is always PPO's dual-clip `compute_policy_loss`",
        "(`compute_policy_loss_reinforce` is imported, never called); `kl_loss_type` only chooses the",
        "`kl_penalty` form added outside the clip when `use_kl_loss=True` and the form of the",
        "in-reward KL when `algorithm.use_kl_in_reward=True` (then scaled by `algorithm.kl_ctrl.kl_coef`).",
        "Every RPG `kl_penalty` form is clamped to [-10, 10]. Each micro-batch's loss is its own",
        "token mean, weighted by rows / mini-batch (dynamic bsz). The reward is the fork's `math_dapo`",
        "(no `\\boxed{}` fallback) with DAPO's overlong shaping where enabled; the LR schedule steps",
        "once per training step. All of this is `src/rpg/algo/fork_loss.h`, checked against the fork's",
        "own code by `ForkParity.EveryScriptSettingMatchesTheForksActorUpdate`.",
        "",
        "Columns: the fork's code (what the released run optimised); the paper's description of the",
        "method the script name refers to; rpg's paper-mode recipe for that cell (`recipes/`, Algorithms",
        "1-2 and Tables 1, 2, 4 as written: docs/algorithms.md); rpg's fork-mode recipe",
        "(`recipes/fork/`, the script's executed overrides, below).",
        "",
        "## How a script becomes a recipe",
        "",
        "Each script is executed by bash in an empty directory with nothing exported but a `PATH` that",
        "holds only a stub `ray`, which records the argv of `ray job submit ... -- python3 -m",
        "recipe.rpg.src.main_rpg ...` (`tests/oracles/fork_scripts.py`): arithmetic such as",
        "`$((max_prompt_length + max_response_length))`, `${VAR:-default}` and quoting are bash's own,",
        "and the directory is written `.` (the fork's checkout) in the paths. Every override it submits",
        "is either a key of the recipe with bash's value or listed in the recipe's header under",
        "\"no effect in rpg\" with the reason; an override in neither stops the generator with an",
        "error. `fork_recipes.match_scripts` checks each of the 60 against rpg itself: `rpg config",
        "show` of the script's own overrides equals that of the recipe, every key left out is one rpg",
        "accepts and has no setting for, and every key kept is one rpg reads.",
        "",
        "Without effect in rpg (scripts that set it):",
        "",
    ] + [line for name, why, keys in NO_EFFECT for line in textwrap.wrap(
        f"- `{name}` ({used.get(name, 0)}): {why}: " + ", ".join(f"`{k}{'*' if k.endswith('.') else ''}`" for k in keys),
        95, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)] + [
        "",
        "## The two modes of `rpg train` (`rpg.semantics`)",
        "",
        "- `rpg.semantics: fork` computes what the fork's code computes for the same keys: the actor",
        "  update of `algo/fork_loss.h` (PPO dual-clip + `kl_loss_coef * agg(kl_penalty(log_prob, ref,",
        "  kl_loss_type))` outside the clip, `ref = old_log_probs` under `use_iterative_ref_model`",
        "  (dp_actor.py:316-318), else the fixed initial policy); the in-reward KL with",
        "  `actor.kl_loss_type` (rpg_ray_trainer.py:195-199); each micro-batch aggregated on its own and",
        "  weighted by rows / mini-batch rows (dynamic bsz: `rearrange_micro_batches`' token-budget",
        "  partition, k = ceil(tokens / ppo_max_token_len_per_gpu), Karmarkar-Karp) or",
        "  1 / gradient_accumulation; mini-batches in batch order every epoch (no shuffle); training",
        "  steps = floor(N / gen_batch_size) x total_epochs (ray_trainer.py:456-488); each epoch's",
        "  prompts in the order of the fork's RandomSampler (a torch.Generator seeded with `data.seed`,",
        "  default 1, each epoch's torch.randperm: ray_trainer.py:449-452); the reward",
        "  `math_dapo_fork`. `policy_loss` other than vanilla/ppo, `seq-mean-token-sum-norm`,",
        "  `old_log_prob_source=rollout`, `ref_kl_target` and rollout correction are refused (the fork",
        "  has no code for them).",
        "- `optim_type=schedulefree` (30 of the 60 scripts) runs as the fork runs it",
        "  (fsdp_workers.py:278-285, dp_actor.py:205-208 and 259-262): schedulefree.AdamWScheduleFree",
        "  with the script's lr, betas and weight_decay (eps 1e-8, no warm-up of its own, r 0,",
        "  weight_lr_power 2); verl's LambdaLR (the script's `lr_warmup_steps`, stepped once per",
        "  training step) writes the scheduled LR into it, so the first step of the constant schedule",
        "  has LR 0 and averaging weight 0. `eval()` (y -> x by interpolation) before the old",
        "  log-probs, `train()` (x -> y by interpolation) before the update: the old log-probs, the",
        "  in-reward KL and, under `use_iterative_ref_model`, the KL reference come from x; sampling,",
        "  the update, validation and checkpoints are at y, except that with `use_kl_in_reward` the",
        "  generation loop computes each round's old log-probs (rpg_ray_trainer.py:132-134) and a",
        "  dynamic-sampling `continue` samples the next round without `train()`: rounds 2..k of a",
        "  step sample at x (13 of the 60 scripts). A checkpoint holds y (the live weights,",
        "  also its Hugging Face `actor/` export, as the fork's `hf_model`), z, the second moment and",
        "  the step / weight sum / lr_max / mode, so a resumed run is bit-identical; the model `rpg",
        "  train` leaves at the end (last checkpoint's `actor/`) is y, as the fork's. In paper",
        "  semantics `schedulefree` is refused; rpg's own `schedule_free_adamw` (its own warm-up over",
        "  optimizer steps, validation and export at x) is the alternative. `actor/lr` is the LR the",
        "  step's optimizer steps used (the fork logs `get_last_lr()` after `scheduler.step()`: the",
        "  next step's).",
        "- `rpg.semantics: paper` runs the paper's algorithms under rpg's names (`policy_loss: rpg` /",
        "  `rpg_reinforce`, docs/algorithms.md); there the fork's `kl_loss_type=rpg_*` spellings are",
        "  read as aliases of those losses (rewritten by `TrainConfig::resolve`, shown by",
        "  `rpg config show`).",
        "- `rpg.semantics: auto` (the default) is `fork` when the config uses a spelling only the",
        "  fork has: `actor_rollout_ref.actor.kl_loss_type=rpg_*`,",
        "  `actor_rollout_ref.actor.optim.optim_type=schedulefree` or `reward_model.reward_manager=rpg`",
        "  (every file of `recipes/fork/`), else `paper` (every file of `recipes/`).",
        "",
        "`rpg train` states the effective algorithm in one line at start, e.g. `fork semantics: PPO",
        "dual-clip (eps 0.2/0.28, c 10), group-mean advantage (rpg), no KL loss (use_kl_loss=False),",
        "reward -= 0.0001 * rpg_rf_rkl(pi_old, pi_old), adamw lr 5e-07, reward math_dapo_fork`.",
        "",
        "Both modes: the LR schedule advances once per training step (verl's LambdaLR), cosine",
        "progress clamped to [0, 1]; `use_kl_loss` is honoured for every policy loss (verl's KL term",
        "is added to a loss that has none); validation runs before training (also after a resume),",
        "every `test_freq` steps and at the last step, with verl's `val-core` (acc mean / maj / best",
        "at the largest n) and `val-aux` (the rest) layout.",
        "",
        "How close fork semantics is to the fork's code, measured by",
        "`TrainerTest.ForkSemanticsStepEqualsTheForksUpdateLoop` (tiny Qwen2, fp32, CPU; the fork's",
        "run transcribed in `tests/oracles/train_fork_step.py` with its `core_algos`,",
        "`torch_functional` and `_balance_batch`, its dynamic-sampling loop, transformers' forward",
        "with `attn_implementation=\"sdpa\"` (transformers' default; the fork's `flash_attention_2`",
        "has no CPU kernel), torch AdamW or schedulefree, the fork's LambdaLR). The oracle's settings",
        "come from the script itself, not from rpg: it runs the `.sh` with bash and a stub `ray`,",
        "composes the fork's `rpg_trainer.yaml` with the script's overrides and then the test's (tiny",
        "batch sizes and lengths, lr 1e-4, raised KL coefficients), and reads every setting from that.",
        "Ten scripts in fp32 (DAPO, GRPO, rpg_ufkl, rf_clip_ppo (rkl and ufkl), rkl_rf, rfpp, rfppb,",
        "two schedule-free ones, one with the KL in the reward) and two in the scripts' own bf16 mixed",
        "precision (DAPO, GRPO; below), each three chained training steps of two",
        "optimizer steps: the scripts' constant schedule with 10 warm-up steps, their 8 ranks with",
        "balance_batch (two cases on 1 and 2 ranks, where each rank cuts uneven token-budget",
        "micro-batches), dynamic sampling with gen_batch_size 3 > train_batch_size 2 (half the prompts",
        "never accurate, so every filtered step generates twice). Per step, started on the oracle's",
        "side from rpg's own weights and optimizer state: the rounds and groups dynamic sampling",
        "keeps, the weights each generation round samples with (x for rounds 2..k with schedule-free",
        "and the KL in the reward), old log-probs, advantages, each optimizer step's gradient, the",
        "weights after the step and the optimizer side alone (the fork's loop on rpg's recorded",
        "gradients); and the fork's own run chained over the three steps against rpg's. Measured",
        "(36 step lines): 32 are **bit-identical** (every difference 0); the others differ by",
        "summation order only: GRPO fp32 steps 2 and 3 (gradients 5.5e-8 of max |g|, weights 2.8e-7,",
        "the chained run 2.2e-7; the short-response case below), DAPO bf16 step 2 and GRPO bf16 step 3 (gradients 8.5e-8 and",
        "1.7e-11, weights 0). The test bounds: weights max",
        "|w - w_fork| / max |w_fork| <= 1e-5 per tensor (the issue's, also for the chained run), the",
        "step max |dw - dw_fork| / max |dw_fork| <= 1e-3 per tensor and 1e-4 in L2, gradients 1e-6",
        "of the tensor's largest element, old log-probs (at response tokens) and advantages 1e-6, the",
        "optimizer side 1e-7, sampling weights 1e-6.",
        "",
        "The fork computes the advantages after `_balance_batch` (balance, old log-probs, then",
        "`compute_advantage`), so its estimators sum the rows in the balanced order; fork semantics",
        "does the same (`Rules::advantage_order`): in the original order the group std and the batch",
        "whitening of rfpp/rfppb were 1.1e-6..1.5e-6 off, 1.2e-5..5.1e-5 of the weights after a step.",
        "What is not bit-identical, within the bounds: a batch with responses that end before the",
        "longest one. rpg scores only response tokens",
        "(the log-softmax and its gradient over the valid positions), the fork's padded pass every",
        "position, so the lm_head gradient sums over a different set (1.9e-7 of max |g|, 2.5e-6 of",
        "the weights after the step). With the scripts' `use_remove_padding=True` the fork packs the",
        "valid tokens and scores every prompt token too: the same kind of difference.",
        "",
        "What it took (each was an ulp per element that the cancelling gradient sum of a group-centred",
        "advantage, then Adam's first step g / (|g| + 1e-8), turned into 1e-5..5e-4 of a zero-initialised",
        "bias after one step):",
        "- the oracle's attention: eager (`matmul`, additive mask, softmax) vs rpg's SDPA gave",
        "  gradients 6e-6..3.8e-5 of max |g| apart, the bulk of what the last session measured. rpg's",
        "  SDPA call (grouped-query heads folded into the query length, boolean mask with the padded",
        "  queries' own diagonal) gives the same bits as transformers' sdpa path (`repeat_kv`, mask",
        "  without the diagonal);",
        "- log-prob gradients: rpg's chunked log-prob backward took p = exp(log_softmax(s)); autograd of",
        "  the fork's `gather - logsumexp` gives exp(s - logsumexp(s)). An ulp per element, 1.4e-6 of",
        "  max |g| after the sums; in fork semantics rpg now computes p as autograd does (same cost;",
        "  `LogProbOptions::autograd_backward`: paper mode keeps log_softmax's p, with which 2-rank bf16",
        "  ZeRO-2 runs stay within 1e-6 of one rank). Fork semantics also runs every row's full forward",
        "  (no shared-prompt split, `split_prompt`: it rounds differently, 5.9e-5..4.9e-4 on the weights);",
        "- `clip_grad_norm`'s total is a float sum of per-tensor norms in parameter order: rpg lists a",
        "  layer's norms first, transformers registers them after the MLP. The total was an ulp off,",
        "  so was the clip coefficient and then isolated elements of the update (the \"one ulp in",
        "  isolated elements\" of the DAPO and rkl_rf cases). In fork semantics the optimizer (and so",
        "  `clip_grad_norm`) now takes the parameters in transformers' registration order (the",
        "  model's own order, and paper mode, are unchanged: reordering the model moved ZeRO-2's",
        "  buckets and broke its bf16 equality test);",
        "- GRPO's group std: rpg summed squared deviations in float; verl and the fork call",
        "  `torch.std` (Welford in double). rpg now takes each group's mean and std by torch's own",
        "  reductions;",
        "- `loss / gradient_accumulation` (dp_actor, fixed-size micro-batches) instead of a multiply",
        "  by the reciprocal (an ulp apart when the count is not a power of two; the scripts use",
        "  dynamic batch sizes, so this one is not exercised by the test).",
        "",
        "Data-parallel: `DataParallelTrain.ZeroOneForkScheduleFreeEqualsOneRank` runs the fork's",
        "schedule-free (`optim_type=schedulefree`, fork semantics) on 2 ranks with `dist.zero_stage=1`",
        "and equals the 1-rank run (samples identical, metrics and weights within 1e-6); it fails when",
        "the parameters are not re-gathered after an eval()/train() switch. ZeRO-2 forms its clip",
        "coefficient as `clip_grad_norm` does (in the gradients' dtype), so its runs stay equal to the",
        "1-rank ones after the changes above.",
        "",
        "These change rpg's numerics by an ulp here and there (both modes: GRPO/group statistics; fork",
        "mode: log-prob gradients, the clip coefficient): a run is no longer bit-identical to one made before,",
        "and the demo's numbers move by training noise.",
        "",
        "The data-parallel layout of the 8-GPU runs is emulated in any number of rpg processes",
        "(`train/fork_rules.cpp`): W = `trainer.nnodes` x `trainer.n_gpus_per_node` ranks; with",
        "`trainer.balance_batch` (the fork's default, true) the fork's `_balance_batch` reorders the",
        "rows into W token-balanced partitions of equal size (`get_seqlen_balanced_partitions`,",
        "equal_size); rank r takes the r-th equal chunk, splits it into mini-batches of",
        "ppo_mini_batch_size x n / W rows and cuts each into its own micro-batches (the token",
        "budget applies per rank); optimizer step m sums the ranks' m-th mini-batches with FSDP's",
        "mean over ranks. `ForkLayout.RankMiniAndMicroBatchesEqualTheForks` checks the rows against",
        "the fork's own `_balance_batch` and verl's dispatch live. FSDP's reduction order is not",
        "reproduced (fp32 rounding). As the fork's `for epoch in range(total_epochs)` loop, a run",
        "ends when dynamic sampling has used up `trainer.total_epochs` passes over the data before",
        "the step count is reached (the step in progress is dropped, no final validation; rpg",
        "still saves the weights trained so far).",
        "",
        "Compute precision: the fork trains under FSDP's MixedPrecision (fsdp_workers.py:227-237, no",
        "script sets it: bf16 parameters for forward and backward, gradients cast to fp32 for the",
        "reduction and accumulated there, fp32 masters and optimizer), and its reference worker loads",
        "the checkpoint in bf16 (`model_dtype`, lines 167-169) and computes in bf16 too. Fork semantics",
        "does the same by default (`actor.compute_dtype` unset resolves to `bfloat16` there, `float32`",
        "in paper semantics; a fixed reference holds the checkpoint's bf16 rounding, computed in the",
        "compute dtype). The fork's log-probs come from flash-attn's cross entropy, fp32 on the bf16",
        "logits; its lm_head gradient is formed from the bf16-rounded logit gradient, which rpg's",
        "chunked log-prob backward now does too in fork semantics (it used the fp32 one: 2.5e-3 of",
        "max |g| on the tied embedding). Two bf16 cases of the step test (DAPO, GRPO with its bf16",
        "reference; the oracle emulates MixedPrecision with a bf16 copy of transformers' model cast",
        "from the fp32 masters at every forward) agree with rpg within 8.5e-8 of max |g| on the",
        "gradients and exactly on the weights, while bf16 and fp32 old log-probs differ by 0.49 on",
        "the same rollouts. What stays different on the fork's GPUs: CUDA's bf16 kernels (cuBLAS,",
        "flash-attention) round differently from the CPU's.",
        "",
        "What fork semantics still does not reproduce, and what it changes:",
        "- the adaptive KL controller is updated once per step (the fork: once per generation batch);",
        "  every script uses the fixed one: no effect on them;",
        "- `filter_groups.metric` `seq_reward` / `seq_final_reward` (rpg: `acc`, `score`); every",
        "  script uses `acc`: no effect on them;",
        "- the sampler's precision: the fork samples with vLLM in bf16 (`rollout.dtype: bfloat16` in its",
        "  config); rpg's `rollout.dtype: auto` samples in bf16 on CUDA and in fp32 on the CPU (the",
        "  same samples on every CPU; an explicit bf16 rollout decodes 1.4-2x faster on CPUs with",
        "  AVX512_BF16 and 1.7-2.5x on CPUs with AMX: docs/benchmarks.md). Effect: which responses",
        "  are drawn (bf16 rounding of the sampling distribution), not",
        "  what an update does with them; `actor_rollout_ref.rollout.dtype=bfloat16` matches the fork;",
        "- the device's kernels: CUDA's bf16/fp32 kernels (cuBLAS, flash-attention, NCCL's reduction",
        "  order over 8 GPUs) round differently from the CPU's and from FSDP's reduce-scatter: effect on",
        "  the weights by rounding only;",
        "- the scripts' packed passes (`use_remove_padding=True`) score every prompt token, rpg's only",
        "  response tokens (above): effect on the weights by rounding only.",
        "",
        "Validation scores as the fork's `val_reward_fn` (the training reward manager, overlong",
        "buffer included) in both modes: `val-aux/<source>/reward/...` is the score plus the",
        "overlong penalty (verl's \"reward\" variable, the reward manager's tensor), `score/...` the",
        "scorer's own value (`TrainerTest.ValidationRewardCarriesTheOverlongPenalty`).",
        "",
        "The reward variant is `reward_model.reward_kwargs.dapo_variant`: `math_dapo` (verl 0.9.1,",
        "last `\\boxed{}` when no `Answer:` line parses) or `math_dapo_fork` (the fork: `Answer:` only);",
        "when unset, `math_dapo_fork` in fork semantics and `math_dapo` in paper semantics (the",
        "default of `recipes/`).",
        "",
        "| script | the fork's code optimises | the paper describes | rpg paper mode | rpg fork mode |",
        "|---|---|---|---|---|",
    ] + rows
    files[os.path.join("docs", "fork-vs-paper.md")] = "\n".join(doc) + "\n"
    return files


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fork-dir", default=default_fork_dir())
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    if not os.path.isdir(os.path.join(args.fork_dir, "recipe", "rpg", "7b")):
        raise SystemExit(f"fork_recipes: the authors' fork is missing at {args.fork_dir} (run scripts/setup.sh)")
    files = generate(args.fork_dir)
    fork_dir = os.path.join(REPO, "recipes", "fork")
    present = {os.path.join("recipes", "fork", f) for f in os.listdir(fork_dir) if f.endswith(".yaml")} \
        if os.path.isdir(fork_dir) else set()
    if args.check:
        bad = []
        for rel, text in sorted(files.items()):
            p = os.path.join(REPO, rel)
            if not os.path.exists(p) or open(p).read() != text:
                bad.append(rel)
        bad += sorted(present - set(files))
        if bad:
            print("fork_recipes: out of date (run scripts/fork_recipes.py): " + ", ".join(bad), file=sys.stderr)
            sys.exit(1)
        print(f"fork_recipes: {len(files)} files up to date")
        return
    os.makedirs(fork_dir, exist_ok=True)
    for rel in present - set(files):
        os.remove(os.path.join(REPO, rel))
    for rel, text in files.items():
        p = os.path.join(REPO, rel)
        tmp = p + ".tmp"
        with open(tmp, "w") as f:
            f.write(text)
        os.replace(tmp, p)
    print(f"fork_recipes: wrote {len(files)} files")


if __name__ == "__main__":
    main()
