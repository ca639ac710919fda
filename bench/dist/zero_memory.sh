#!/usr/bin/env bash
# Memory per rank of ZeRO-0/1/2 on 1 and 2 ranks (rpg launch, Gloo over loopback): two
# training steps (the second is reported: ZeRO-2 rebuilds its buckets after the first
# mini-batch) of a freshly initialised Qwen2 (`rpg model init`, ~38 M parameters by
# default), with fp32 compute and with bf16 compute. For each run and rank it prints the
# bytes the code accounts for (dist/memory.h, logged as perf/memory/*: the peak of gradient
# tensors, the optimizer state, the optimizer's parameters = the fp32 weights, and under
# ZeRO-2 the gradient shard and the largest bucket), the peak RSS (perf/max_rss_gb), and
# `rpg plan`'s estimate of the same run's weights + gradients + optimizer state.
#
# usage: bench/dist/zero_memory.sh [HIDDEN] [LAYERS] [BUCKET_MB] [all|zero2|master]
#   HIDDEN     hidden size (default 512); LAYERS decoder layers (default 10); MLP 4 x HIDDEN
#   BUCKET_MB  dist.reduce_bucket_mb (default 25, the default)
#   all|zero2|master  every configuration (default), only the 2-rank ZeRO-2 ones, or bf16
#              compute with dist.shard_master_weights=true (1 rank, 2 ranks ZeRO-1 and 2;
#              "weights" are then the bf16 ones, "masters" the fp32 masters this rank holds)
# The tokenizer is the tests' tiny chat model's (build/oracle-cache, made by
# tests/oracles/tiny_chat_model.py: run the dist tests once).
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rpg="$repo/build/rpg"
hidden=${1:-512}
layers=${2:-10}
bucket=${3:-25}
which=${4:-all}
tok=$(ls -d "$repo"/build/oracle-cache/tiny_chat_model-*/model 2>/dev/null | head -1)
[[ -x "$rpg" ]] || { echo "zero_memory: build rpg first (cmake --build build --target rpg)" >&2; exit 1; }
[[ -d "$tok" ]] || { echo "zero_memory: no tokenizer (run the dist tests once to make the tiny model)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$rpg" model init --tokenizer "$tok" --output "$work/model" --hidden "$hidden" --layers "$layers" --heads 8 \
  --kv-heads 2 --intermediate $((hidden * 4)) --max-positions 512 > /dev/null
for i in $(seq 0 15); do echo "{\"problem\": \"$i+1?\", \"answer\": \"$((i + 1))\"}"; done > "$work/p.jsonl"
"$rpg" data prepare "$work/p.jsonl" "$work/p.parquet" --data-source math_dapo > /dev/null
args=("actor_rollout_ref.model.path=$work/model" "data.train_files=$work/p.parquet"
      data.train_batch_size=4 data.max_prompt_length=256 data.max_response_length=16
      actor_rollout_ref.rollout.n=2 actor_rollout_ref.actor.ppo_mini_batch_size=2
      actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=1 actor_rollout_ref.actor.policy_loss=rpg_reinforce
      algorithm.adv_estimator=rpg_batch trainer.save_freq=-1 trainer.device=cpu trainer.seed=1
      trainer.val_before_train=false trainer.total_training_steps=2 "dist.reduce_bucket_mb=$bucket")
"$repo/.venv/bin/python" - "$rpg" "$work" "$which" "${args[@]}" <<'PY'
import json, os, re, subprocess, sys
rpg, work, which, args = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
env = dict(os.environ, OMP_NUM_THREADS="1")
MiB = 1024 * 1024

def plan(ranks, extra):
    out = subprocess.run([rpg, "plan", "-", *args, *extra, "--world-size", str(ranks)], env=env,
                         capture_output=True, text=True, check=True).stdout
    def field(name):
        m = re.search(rf"^  {re.escape(name)}\s+([0-9.]+) (MiB|GiB)", out, re.M)
        return float(m.group(1)) * (1024 if m.group(2) == "GiB" else 1)
    if which == "master":
        return (field("weights (bf16)"), field("master weights (fp32)"), field("gradients (fp32)"),
                field("optimizer state (fp32)"))
    return field("weights (fp32)"), field("gradients (fp32)"), field("optimizer state (fp32)")

def run(ranks, stage, compute):
    name = f"r{ranks}_z{stage}_{compute}"
    extra = [f"dist.zero_stage={stage}", f"actor_rollout_ref.actor.compute_dtype={compute}"]
    if which == "master":
        extra.append("dist.shard_master_weights=true")
    cmd = [rpg] + (["launch", "--nproc", str(ranks), "--"] if ranks > 1 else []) + ["train", "-", *args, *extra,
           f"trainer.default_local_dir={work}/{name}"]
    r = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if r.returncode:
        sys.exit(r.stderr[-3000:])
    planned = plan(ranks, extra)
    for k in range(ranks):
        f = f"{work}/{name}/metrics.jsonl" if k == 0 else f"{work}/{name}/rank_{k}/metrics.jsonl"
        m = [r for r in map(json.loads, open(f)) if "timing_s/step" in r][-1]  # the last step's record
        g = lambda key: m.get("perf/memory/" + key, 0) / MiB
        masters = f"{g('master_bytes'):.1f} | " if which == "master" else ""
        print(f"| {ranks} | {stage} | {compute} | {k} | {g('weight_bytes'):.1f} | {masters}{g('grad_bytes_max'):.1f} | "
              f"{g('grad_shard_bytes'):.1f} | {g('grad_bucket_bytes'):.1f} | {g('optimizer_state_bytes'):.1f} | "
              f"{m['perf/max_rss_gb'] * 1024:.0f} | {' / '.join(f'{x:.1f}' for x in planned)} |", flush=True)

p = json.load(open(f"{work}/model/config.json"))
print(f"model: hidden {p['hidden_size']}, {p['num_hidden_layers']} layers, MLP {p['intermediate_size']}, "
      f"vocab {p['vocab_size']}; reduce_bucket_mb {[a for a in args if a.startswith('dist.reduce')][0].split('=')[1]}")
if which == "master":
    print("| ranks | ZeRO | compute | rank | weights MiB | masters MiB | grad peak MiB | grad shard MiB | bucket MiB "
          "| optimizer MiB | peak RSS MiB | plan: weights / masters / grads / optimizer MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for ranks, stage in [(1, 1), (2, 1), (2, 2)]:
        run(ranks, stage, "bfloat16")
    sys.exit(0)
print("| ranks | ZeRO | compute | rank | weights MiB | grad peak MiB | grad shard MiB | bucket MiB | optimizer MiB "
      "| peak RSS MiB | plan: weights / grads / optimizer MiB |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for ranks, stage, compute in [(1, 0, "float32"), (2, 0, "float32"), (2, 1, "float32"), (2, 2, "float32"),
                              (1, 0, "bfloat16"), (2, 1, "bfloat16"), (2, 2, "bfloat16")]:
    if which == "all" or (ranks, stage) == (2, 2):
        run(ranks, stage, compute)
PY
