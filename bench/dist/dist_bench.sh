#!/usr/bin/env bash
# rpg train on 1 rank vs 2 ranks (rpg launch, Gloo over loopback), one thread per rank, the
# same global batch and seed: seconds per step (phase by phase), steps/s and response
# tokens/s, from each run's metrics.jsonl (rank 0's; the first step is dropped as warm-up).
#
# usage: bench/dist/dist_bench.sh [MODEL_DIR] [STEPS]
#   MODEL_DIR  a Hugging Face model directory (default: the tests' tiny chat model in
#              build/oracle-cache, made by tests/oracles/tiny_chat_model.py)
#   STEPS      training steps per run (default 6)
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rpg="$repo/build/rpg"
model=${1:-$(ls -d "$repo"/build/oracle-cache/tiny_chat_model-*/model 2>/dev/null | head -1)}
steps=${2:-6}
[[ -x "$rpg" ]] || { echo "dist_bench: build rpg first (cmake --build build --target rpg)" >&2; exit 1; }
[[ -d "$model" ]] || { echo "dist_bench: no model dir (give one, or run the dist tests once to make the tiny model)" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for i in $(seq 0 31); do echo "{\"problem\": \"$i+1?\", \"answer\": \"$((i + 1))\"}"; done > "$work/p.jsonl"
"$rpg" data prepare "$work/p.jsonl" "$work/p.parquet" --data-source math_dapo > /dev/null
args=(train - "actor_rollout_ref.model.path=$model" "data.train_files=$work/p.parquet"
      data.train_batch_size=8 data.max_prompt_length=256 data.max_response_length=64
      actor_rollout_ref.rollout.n=4 actor_rollout_ref.actor.ppo_mini_batch_size=4
      actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4 actor_rollout_ref.actor.policy_loss=rpg_reinforce
      algorithm.adv_estimator=rpg_batch "trainer.total_training_steps=$steps" trainer.save_freq=-1
      trainer.device=cpu trainer.seed=1)
OMP_NUM_THREADS=1 "$rpg" "${args[@]}" "trainer.default_local_dir=$work/one" > "$work/one.log" 2>&1
OMP_NUM_THREADS=1 "$rpg" launch --nproc 2 -- "${args[@]}" "trainer.default_local_dir=$work/two" > "$work/two.log" 2>&1
"$repo/.venv/bin/python" - "$work/one/metrics.jsonl" "$work/two/metrics.jsonl" <<'PY'
import json, sys
def load(p):
    rows = [json.loads(l) for l in open(p)][1:]  # drop the warm-up step
    mean = lambda k: sum(r.get(k, 0.0) for r in rows) / len(rows)
    keys = ["timing_s/step", "timing_s/gen", "timing_s/old_log_prob", "timing_s/ref", "timing_s/update_actor"]
    out = {k: mean(k) for k in keys}
    out["tokens/step"] = mean("response_length/mean") * 8 * 4
    return out
one, two = load(sys.argv[1]), load(sys.argv[2])
print("| ranks | s/step | gen | old_log_prob | ref | update_actor | steps/s | response tokens/s |")
print("|---|---|---|---|---|---|---|---|")
for n, m in ((1, one), (2, two)):
    print(f"| {n} | {m['timing_s/step']:.2f} | {m['timing_s/gen']:.2f} | {m['timing_s/old_log_prob']:.2f} | "
          f"{m['timing_s/ref']:.2f} | {m['timing_s/update_actor']:.2f} | {1 / m['timing_s/step']:.3f} | "
          f"{m['tokens/step'] / m['timing_s/step']:.1f} |")
print(f"speed-up 2 vs 1 rank: {one['timing_s/step'] / two['timing_s/step']:.2f}x")
PY
