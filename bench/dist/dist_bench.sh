#!/usr/bin/env bash
# rpg train on 1 rank vs 2 ranks (rpg launch, Gloo over loopback), one thread per rank, the
# same global batch, seed and data: the same work, done by one process or shared by two.
#
# Measured for each world size, side by side:
#   - wall seconds per step and response tokens/s (from rank 0's metrics.jsonl, steps 2..N:
#     the first step is warm-up), and the ratio 2 ranks / 1 rank;
#   - CPU seconds of all processes together (user + sys, getrusage of the whole process
#     tree) for N steps minus the same run with 1 step, per step: the work itself, which a
#     loaded machine slows down much less than it slows the wall clock. 2 ranks' CPU per
#     step over 1 rank's is the overhead of data parallelism on CPU (communication,
#     replicated work); 2 x CPU(1 rank) / CPU(2 ranks) is the speed-up 2 idle cores would
#     give if the ranks stay balanced and waiting costs nothing (a projection, not a
#     measurement).
#
# usage: bench/dist/dist_bench.sh [STEPS] [HIDDEN] [LAYERS]
#   STEPS   training steps per run (default 5)
#   HIDDEN  hidden size of the freshly initialised Qwen2 model (`rpg model init`; default 256)
#   LAYERS  its decoder layers (default 4)
# The tokenizer is the tests' tiny chat model's (build/oracle-cache, made by
# tests/oracles/tiny_chat_model.py: run the dist tests once).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rpg="$repo/build/rpg"
steps=${1:-5}
hidden=${2:-256}
layers=${3:-4}
tok=$(ls -d "$repo"/build/oracle-cache/tiny_chat_model-*/model 2>/dev/null | head -1)
[[ -x "$rpg" ]] || { echo "dist_bench: build rpg first (cmake --build build --target rpg)" >&2; exit 1; }
[[ -d "$tok" ]] || { echo "dist_bench: no tokenizer (run the dist tests once to make the tiny model)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$rpg" model init --tokenizer "$tok" --output "$work/model" --hidden "$hidden" --layers "$layers" --heads 8 \
  --kv-heads 4 --intermediate $((hidden * 4)) --max-positions 512 > /dev/null
for i in $(seq 0 63); do echo "{\"problem\": \"$i+1?\", \"answer\": \"$((i + 1))\"}"; done > "$work/p.jsonl"
"$rpg" data prepare "$work/p.jsonl" "$work/p.parquet" --data-source math_dapo > /dev/null
args=(train - "actor_rollout_ref.model.path=$work/model" "data.train_files=$work/p.parquet"
      data.train_batch_size=8 data.max_prompt_length=256 data.max_response_length=64
      actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=4
      actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 actor_rollout_ref.actor.policy_loss=rpg_reinforce
      actor_rollout_ref.rollout.ignore_eos=true algorithm.adv_estimator=rpg_batch trainer.save_freq=-1
      trainer.device=cpu trainer.seed=1 trainer.val_before_train=false trainer.sample_log_freq=1
      trainer.sample_log_count=100)
"$repo/.venv/bin/python" - "$rpg" "$work" "$steps" "${args[@]}" <<'PY'
import json, os, resource, subprocess, sys
rpg, work, steps, args = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
env = dict(os.environ, OMP_NUM_THREADS="1")

def run(ranks, n, name):
    """Runs n steps on `ranks` ranks; returns (CPU seconds of the process tree, run dir)."""
    cmd = [rpg] + (["launch", "--nproc", str(ranks), "--"] if ranks > 1 else []) + args
    cmd += [f"trainer.total_training_steps={n}", f"trainer.default_local_dir={work}/{name}"]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        sys.exit(r.stderr[-3000:])
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), f"{work}/{name}"

def measure(ranks):
    cpu1, _ = run(ranks, 1, f"r{ranks}_one")
    cpun, d = run(ranks, steps, f"r{ranks}_all")
    # Step records only (a checkpoint's timing record has no timing_s/step); the first is the warm-up.
    rows = [r for r in map(json.loads, open(f"{d}/metrics.jsonl")) if "timing_s/step" in r][1:]
    mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
    wall = mean("timing_s/step")
    tokens = mean("response_length/mean") * 8 * 4
    return {"wall": wall, "gen": mean("timing_s/gen"), "update": mean("timing_s/update_actor"),
            "tok_s": tokens / wall, "cpu": (cpun - cpu1) / (steps - 1), "samples": open(f"{d}/samples.jsonl").read()}

one, two = measure(1), measure(2)
print(f"load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
print("| ranks | wall s/step | gen | update_actor | response tokens/s | CPU s/step (all ranks) |")
print("|---|---|---|---|---|---|")
for n, m in ((1, one), (2, two)):
    print(f"| {n} | {m['wall']:.2f} | {m['gen']:.2f} | {m['update']:.2f} | {m['tok_s']:.0f} | {m['cpu']:.2f} |")
print(f"wall-clock ratio (tokens/s, 2 ranks / 1 rank): {two['tok_s'] / one['tok_s']:.2f}x")
print(f"CPU per step, 2 ranks / 1 rank: {two['cpu'] / one['cpu']:.2f}x (data-parallel overhead)")
print(f"projected on 2 idle cores: {2 * one['cpu'] / two['cpu']:.2f}x")
print("same responses and rewards on 1 and 2 ranks:", one["samples"] == two["samples"])
PY
