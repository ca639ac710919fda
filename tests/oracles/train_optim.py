"""Oracle for src/rpg/train/optim: runs torch.optim.AdamW, schedulefree.AdamWScheduleFree,
torch.nn.utils.clip_grad_norm_ and verl's LR schedules on inputs written by the C++ test.

usage: train_optim.py CASE.json IN.safetensors OUT.safetensors
CASE.json: {"kind": "adamw"|"schedule_free"|"schedule_free_events"|"clip"|"lr", ...}. IN holds "p.<i>" (initial
parameters) and "g.<step>.<i>" (gradient of parameter i at step; absent -> no gradient).
OUT gets "p.<step>.<i>" after each step (and "x.<i>" = schedule-free evaluation weights).
"""
import json
import sys

import torch
from safetensors.torch import load_file, save_file

case = json.load(open(sys.argv[1]))
kind = case["kind"]
out = {}

if kind == "lr":
    from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

    for j, sc in enumerate(case["schedules"]):
        opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
        if sc.get("fork_dir"):  # the authors' fork's own torch_functional (fork_modules.py)
            import fork_modules
            fork_F = fork_modules.core_algos(sc["fork_dir"]).verl_F
            if sc["type"] == "constant":
                sched = fork_F.get_constant_schedule_with_warmup(opt, num_warmup_steps=sc["warmup"])
            else:
                sched = fork_F.get_cosine_schedule_with_warmup(opt, num_warmup_steps=sc["warmup"],
                                                               num_training_steps=sc["total"])
        elif sc["type"] == "constant":
            sched = get_constant_schedule_with_warmup(opt, num_warmup_steps=sc["warmup"])
        else:
            sched = get_cosine_schedule_with_warmup(opt, num_warmup_steps=sc["warmup"], num_training_steps=sc["total"],
                                                    min_lr_ratio=sc["min_lr_ratio"], num_cycles=sc["num_cycles"])
        factors = []
        for _ in range(case["steps"]):
            factors.append(opt.param_groups[0]["lr"])
            opt.step()
            sched.step()
        out[f"factors.{j}"] = torch.tensor(factors, dtype=torch.float64)
    save_file(out, sys.argv[3])
    sys.exit(0)

tensors = load_file(sys.argv[2])
n = case["num_params"]
params = [torch.nn.Parameter(tensors[f"p.{i}"].clone()) for i in range(n)]

if kind == "schedule_free_events":
    # schedulefree.AdamWScheduleFree driven as the authors' fork drives it: constructed with
    # lr/betas/weight_decay (fsdp_workers.py:282), a LambdaLR writing the scheduled LR into the
    # param group before each step, eval()/train() at the trainer's switching points
    # (dp_actor.py:205-208, 259-262), foreach as its default. Events: {"op": "train"|"eval"} or
    # {"op": "step", "lr": group lr}; "p.<event>.<i>" after each.
    import schedulefree

    opt = schedulefree.AdamWScheduleFree(params, lr=case["lr"], betas=(case["beta1"], case["beta2"]), eps=case["eps"],
                                         weight_decay=case["weight_decay"], warmup_steps=case["warmup"],
                                         r=case["r"], weight_lr_power=case["weight_lr_power"])
    step = 0
    for e, ev in enumerate(case["events"]):
        if ev["op"] == "train":
            opt.train()
        elif ev["op"] == "eval":
            opt.eval()
        else:
            for i, p in enumerate(params):
                key = f"g.{step}.{i}"
                p.grad = tensors[key].clone() if key in tensors else None
            for group in opt.param_groups:
                group["lr"] = ev["lr"]
            opt.step()
            out[f"lr.{step}"] = torch.tensor([opt.param_groups[0]["scheduled_lr"]], dtype=torch.float64)
            step += 1
        for i, p in enumerate(params):
            out[f"p.{e}.{i}"] = p.detach().clone()
    save_file(out, sys.argv[3])
    sys.exit(0)

if kind == "clip":
    for i, p in enumerate(params):
        if f"g.0.{i}" in tensors:
            p.grad = tensors[f"g.0.{i}"].clone()
    total = torch.nn.utils.clip_grad_norm_(params, max_norm=case["max_norm"])
    out["total_norm"] = total.reshape(1).to(torch.float64)
    for i, p in enumerate(params):
        if p.grad is not None:
            out[f"grad.{i}"] = p.grad
    save_file(out, sys.argv[3])
    sys.exit(0)

if kind == "adamw":
    from verl.utils.torch_functional import get_constant_schedule_with_warmup

    opt = torch.optim.AdamW(params, lr=case["lr"], betas=(case["beta1"], case["beta2"]), eps=case["eps"],
                            weight_decay=case["weight_decay"], foreach=False)
    sched = get_constant_schedule_with_warmup(opt, num_warmup_steps=case["warmup"])
else:
    import schedulefree

    opt = schedulefree.AdamWScheduleFree(params, lr=case["lr"], betas=(case["beta1"], case["beta2"]), eps=case["eps"],
                                         weight_decay=case["weight_decay"], warmup_steps=case["warmup"],
                                         r=case["r"], weight_lr_power=case["weight_lr_power"], foreach=False)
    opt.train()
    sched = None

for step in range(case["steps"]):
    for i, p in enumerate(params):
        key = f"g.{step}.{i}"
        p.grad = tensors[key].clone() if key in tensors else None
    opt.step()
    if sched is not None:
        sched.step()
    for i, p in enumerate(params):
        out[f"p.{step}.{i}"] = p.detach().clone()

if kind == "schedule_free":
    opt.eval()
    for i, p in enumerate(params):
        out[f"x.{i}"] = p.detach().clone()

save_file(out, sys.argv[3])
