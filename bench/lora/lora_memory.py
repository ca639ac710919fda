"""One RL step of `rpg train` on a Qwen2.5-1.5B-shaped random model, full fine-tuning vs LoRA,
side by side in one run: the measured peak RSS of each process (getrusage of the child), the
step's seconds, the accounted bytes the trainer logs (perf/memory/*), and `rpg plan`'s
estimate of the same configuration.

  .venv/bin/python bench/lora/lora_memory.py [--rpg build/rpg] [--work DIR] [--limit-gib 22]
      [--rank 16] [--threads 2] [--modes full,lora]

The model: transformers' Qwen2ForCausalLM with Qwen2.5-1.5B's config.json shapes (hidden 1536,
28 layers, 12 heads / 2 KV heads, MLP 8960, tied embeddings), randomly initialised (seed 0) and
saved in fp32, with SmolLM2-135M-Instruct's tokenizer files and so its 49,152-token vocabulary:
1.39 B parameters. (Qwen's 151,936 rows would add 0.16 B, but a random model samples every id
of its vocabulary, and ids past the tokenizer's cannot be decoded.) Data: 4 prompts "i+1?", 2 responses each, 32
new tokens; one mini-batch, fp32 compute, gradient checkpointing on, AdamW, GRPO with a KL
loss to the fixed reference (what LoRA makes free: the base with the adapters off).

Each run gets an address-space limit of --limit-gib (ulimit -v), so a configuration that does
not fit fails with rpg's "out of memory" line instead of pushing the machine into swap or the
OOM killer; such a run is reported as not fitting, with the limit.
"""
import argparse
import json
import os
import re
import resource
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

ap = argparse.ArgumentParser()
ap.add_argument("--rpg", default=os.path.join(REPO, "build", "rpg"))
ap.add_argument("--work", default="/tmp/rpg-lora-bench")
ap.add_argument("--limit-gib", type=float, default=22.0)
ap.add_argument("--rank", type=int, default=16)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--modes", default="full,lora,lora_bf16",
                help="full: every weight; lora: rank --rank adapters, fp32; *_bf16: compute_dtype=bfloat16 "
                     "(with LoRA a bf16 base and fp32 adapters)")
ap.add_argument("--tokenizer", default=os.path.expanduser("~/.cache/rpg/models/SmolLM2-135M-Instruct"))
args = ap.parse_args()

model_dir = os.path.join(args.work, "qwen2.5-1.5b-shape-v49152")


def make_model():
    if os.path.exists(os.path.join(model_dir, "model.safetensors.index.json")) or os.path.exists(
            os.path.join(model_dir, "model.safetensors")):
        return
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                      num_key_value_heads=2, vocab_size=49152, max_position_embeddings=32768, rope_theta=1e6,
                      rms_norm_eps=1e-6, tie_word_embeddings=True, torch_dtype="float32")
    with torch.no_grad():
        model = Qwen2ForCausalLM(cfg)
    tmp = model_dir + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json"):
        src = os.path.join(args.tokenizer, f)
        if os.path.exists(src):
            shutil.copy(src, tmp)
    os.replace(tmp, model_dir)
    print(f"model: {sum(p.numel() for p in model.parameters())} parameters in {model_dir}", flush=True)


def make_data():
    data = os.path.join(args.work, "p.parquet")
    if os.path.exists(data):
        return data
    with open(os.path.join(args.work, "p.jsonl"), "w") as f:
        for i in range(8):
            f.write(json.dumps({"problem": f"{i}+1?", "answer": str(i + 1)}) + "\n")
    subprocess.run([args.rpg, "data", "prepare", os.path.join(args.work, "p.jsonl"), data, "--data-source", "math_dapo"],
                   check=True, stdout=subprocess.DEVNULL)
    return data


def train_args(data, run, mode):
    a = [f"actor_rollout_ref.model.path={model_dir}", f"data.train_files={data}", "data.train_batch_size=4",
         "data.max_prompt_length=256", "data.max_response_length=32", "actor_rollout_ref.rollout.n=2",
         "actor_rollout_ref.rollout.ignore_eos=true", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
         "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4", "actor_rollout_ref.actor.policy_loss=grpo",
         "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.001",
         "algorithm.adv_estimator=grpo", "trainer.total_training_steps=1", "trainer.save_freq=-1",
         "trainer.device=cpu", "trainer.val_before_train=false", f"trainer.default_local_dir={run}"]
    if mode.startswith("lora"):
        a += [f"actor_rollout_ref.model.lora_rank={args.rank}", f"actor_rollout_ref.model.lora_alpha={2 * args.rank}"]
    if mode.endswith("bf16"):
        a += ["actor_rollout_ref.actor.compute_dtype=bfloat16"]
    return a


def plan_total(data, mode):
    out = subprocess.run([args.rpg, "plan", "-", *train_args(data, "/tmp/unused", mode)], capture_output=True, text=True,
                         check=True).stdout
    m = re.search(r"^total .*\((\d+) bytes\)", out, re.M)
    return int(m.group(1)), out


def run(data, mode):
    run_dir = os.path.join(args.work, f"run_{mode}")
    shutil.rmtree(run_dir, ignore_errors=True)
    limit = int(args.limit_gib * 2**30)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))

    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    t0 = time.time()
    log = os.path.join(args.work, f"{mode}.log")
    with open(log, "w") as err:  # os.wait4: this child's own peak RSS
        p = subprocess.Popen([args.rpg, "train", "-", *train_args(data, run_dir, mode)], env=env, preexec_fn=cap,
                             stdout=subprocess.DEVNULL, stderr=err)
        _, status, usage = os.wait4(p.pid, 0)
    wall = time.time() - t0
    code = os.waitstatus_to_exitcode(status)
    result = {"mode": mode, "exit": code, "wall_s": wall, "peak_rss_gib": usage.ru_maxrss * 1024 / 2**30}
    stderr = open(log).read()
    if code != 0:
        result["error"] = (stderr.strip().splitlines() or ["?"])[-1]
        return result
    metrics = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl")) if '"timing_s/step"' in l]
    m = metrics[-1]
    result.update({k: m.get(k) for k in ("timing_s/step", "timing_s/gen", "timing_s/update_actor", "timing_s/ref",
                                         "perf/max_rss_gb", "perf/memory/weight_bytes",
                                         "perf/memory/optimizer_state_bytes", "perf/memory/grad_bytes_max",
                                         "perf/memory/frozen_weight_bytes")})
    return result


os.makedirs(args.work, exist_ok=True)
make_model()
data = make_data()
rows = []
for mode in args.modes.split(","):
    total, text = plan_total(data, mode)
    r = run(data, mode)
    r["plan_gib"] = total / 2**30
    rows.append(r)
    print(json.dumps(r), flush=True)
    print(text, flush=True)

print(f"\n| mode | exit | peak RSS GiB (measured) | rpg plan GiB | step s | update s | weight / optimizer-state / "
      f"gradient bytes (accounted) |")
print("|---|---|---|---|---|---|---|")
for r in rows:
    acc = "/".join(f"{(r.get(k) or 0) / 2**30:.2f}" for k in ("perf/memory/weight_bytes",
                                                               "perf/memory/optimizer_state_bytes",
                                                               "perf/memory/grad_bytes_max"))
    rss = f"{r['peak_rss_gib']:.2f}" if r.get("peak_rss_gib") else "-"
    step = f"{r['timing_s/step']:.1f}" if r.get("timing_s/step") else r.get("error", "-")
    upd = f"{r['timing_s/update_actor']:.1f}" if r.get("timing_s/update_actor") else "-"
    print(f"| {r['mode']} | {r['exit']} | {rss} | {r['plan_gib']:.2f} | {step} | {upd} | {acc} GiB |")
