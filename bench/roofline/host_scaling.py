"""The trainer's own work as the step grows (issue 35, item 3: "no super-linear surprises ...
host copies"): `rpg train` on a model so small that its FLOPs are a minor part of the step,
at batches to 512 sequences and responses to 4096 tokens, EOS ignored (every response full
length). What is not the model's passes (rollout, old / reference log-probs, update) is the
trainer's bookkeeping: detokenising and scoring responses, advantages, building the padded
batch, metrics. If any of it grew faster than the tokens, "other per 1k tokens" would rise.

  .venv/bin/python bench/roofline/host_scaling.py [--rpg build/rpg] [--work /tmp/rpg-host-scaling]
      [--grid 8x256,64x256,512x256,8x1024,8x4096] [--n 8] [--steps 3]

Each point is a fresh `rpg train` of --steps steps (the first dropped: it meets its shapes
cold); the columns are the mean of the rest, from its metrics.jsonl (timing_s/*).
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

ap = argparse.ArgumentParser()
ap.add_argument("--rpg", default=os.path.join(REPO, "build", "rpg"))
ap.add_argument("--work", default="/tmp/rpg-host-scaling")
ap.add_argument("--grid", default="8x256,64x256,512x256,8x1024,8x4096", help="BxL points: sequences x response tokens")
ap.add_argument("--n", type=int, default=8, help="responses per prompt")
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--threads", type=int, default=2)
args = ap.parse_args()
work = args.work
os.makedirs(work, exist_ok=True)


def rpg(*argv, **kw):
    r = subprocess.run([args.rpg, *argv], capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"host_scaling: rpg {' '.join(argv)} exited {r.returncode}: {r.stderr[-2000:]}")
    return r


# A model of our own (no downloads): the soak's pieces, with room for 4096-token responses.
model = os.path.join(work, "model")
if not os.path.exists(os.path.join(model, "model.safetensors")):
    rpg("data", "synth", os.path.join(work, "data"), "--train", "256", "--val", "16", "--test", "16", "--seed", "0")
    with open(os.path.join(work, "corpus.txt"), "w") as out:
        for line in open(os.path.join(work, "data", "train_sft.jsonl")):
            r = json.loads(line)
            out.write(r["prompt"] + " " + r["response"] + "\n")
    rpg("tokenizer", "train", "--corpus", os.path.join(work, "corpus.txt"), "--vocab-size", "400",
        "--output", os.path.join(work, "tok"))
    rpg("model", "init", "--tokenizer", os.path.join(work, "tok"), "--output", model, "--hidden", "64", "--layers",
        "2", "--heads", "4", "--kv-heads", "2", "--intermediate", "128", "--max-positions", "8192", "--seed", "0")
train_file = next(os.path.join(work, "data", f) for f in sorted(os.listdir(os.path.join(work, "data")))
                  if "train" in f and f.endswith(".parquet"))

PASSES = ("gen", "old_log_prob", "ref", "update_actor")
rows = []
for point in args.grid.split(","):
    B, L = (int(x) for x in point.split("x"))
    prompts = B // args.n
    run = os.path.join(work, f"run_{B}x{L}")
    subprocess.run(["rm", "-rf", run], check=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    rpg("train", "-", f"actor_rollout_ref.model.path={model}", f"data.train_files={train_file}",
        f"data.train_batch_size={prompts}", "data.max_prompt_length=320", f"data.max_response_length={L}",
        f"actor_rollout_ref.rollout.n={args.n}", "actor_rollout_ref.rollout.ignore_eos=true",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={prompts}", "actor_rollout_ref.actor.policy_loss=rpg_reinforce",
        "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.actor.kl_loss_coef=0.1",
        "algorithm.adv_estimator=rpg_batch", f"trainer.total_training_steps={args.steps}", "trainer.save_freq=-1",
        "trainer.device=cpu", "trainer.val_before_train=false", f"trainer.default_local_dir={run}", env=env)
    steps = [json.loads(line) for line in open(os.path.join(run, "metrics.jsonl")) if '"timing_s/step"' in line]
    kept = steps[1:] or steps
    mean = {k: sum(s[f"timing_s/{k}"] for s in kept) / len(kept) for k in ("step", *PASSES)}
    tokens = sum(s["perf/total_num_tokens"] for s in kept) / len(kept)
    other = mean["step"] - sum(mean[k] for k in PASSES)
    rows.append((B, L, tokens, mean, other))
    print(f"  B={B} L={L}: step {mean['step']:.2f} s, other {other:.3f} s", file=sys.stderr, flush=True)

print("\n| B | L | tokens per step | step s | rollout s | old + ref log-probs s | update s | other s | "
      "other per 1k tokens ms | step per 1k tokens ms |")
print("|---|---|---|---|---|---|---|---|---|---|")
for B, L, tokens, m, other in rows:
    print(f"| {B} | {L} | {tokens:.0f} | {m['step']:.2f} | {m['gen']:.2f} | {m['old_log_prob'] + m['ref']:.2f} | "
          f"{m['update_actor']:.2f} | {other:.3f} | {1e3 * other / tokens * 1e3:.2f} | "
          f"{1e3 * m['step'] / tokens * 1e3:.1f} |")
