#!/usr/bin/env bash
# Soak test (docs/robustness.md): a CPU training run of about SOAK_SECONDS (default 3600)
# that is SIGKILLed and SIGTERMed at random moments and restarted until it finishes; then
#   1. its final weights and training state equal (byte for byte) an uninterrupted run's,
#      and its per-step metrics (wall-clock ones aside) are the same;
#   2. the resident memory of every restarted process, sampled when it is signalled (after
#      at least one finished step), stays within 10% of the first process's; and the
#      uninterrupted run's memory after its last step is within 10% of that after its first.
#   scripts/soak.sh [WORK_DIR]
# Environment: RPG (binary, default build/rpg), SOAK_SECONDS, SOAK_SEED (random moments),
# SOAK_MIN_GAP / SOAK_MAX_GAP (seconds between restart and signal, default 5 / 40).
# Exit 0 when every check passes; the summary line is the result to record.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
rpg=${RPG:-$src/build/rpg}
work=${1:-$(mktemp -d /tmp/rpg-soak.XXXXXX)}
secs=${SOAK_SECONDS:-3600}
seed=${SOAK_SEED:-1}
min_gap=${SOAK_MIN_GAP:-5}
max_gap=${SOAK_MAX_GAP:-40}
RANDOM=$seed
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$work"
log() { echo "[soak $(date -u +%T)] $*" >&2; }

# A small model, tokenizer and data of our own (no downloads): the demo's pieces.
if [ ! -f "$work/model/model.safetensors" ]; then
  "$rpg" data synth "$work/data" --train 256 --val 16 --test 16 --seed 0 >/dev/null 2>&1
  python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
with open(f"{work}/corpus.txt", "w") as out:
    for line in open(f"{work}/data/train_sft.jsonl"):
        r = json.loads(line); out.write(r["prompt"] + " " + r["response"] + "\n")
PY
  "$rpg" tokenizer train --corpus "$work/corpus.txt" --vocab-size 400 --output "$work/tok" >/dev/null 2>&1
  "$rpg" model init --tokenizer "$work/tok" --output "$work/model" --hidden 64 --layers 2 --heads 4 --kv-heads 2 \
    --intermediate 128 --seed 0 >/dev/null 2>&1
fi
train_file=$(ls "$work"/data/*train*.parquet | head -1)
args() {  # $1 run dir, $2 steps
  echo - "actor_rollout_ref.model.path=$work/model" "data.train_files=$train_file" data.train_batch_size=4 \
    data.max_prompt_length=320 data.max_response_length=24 actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.policy_loss=rpg_reinforce \
    actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.entropy_coeff=0.01 \
    actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.1 algorithm.adv_estimator=rpg_batch \
    "trainer.total_training_steps=$2" trainer.save_freq=3 trainer.max_actor_ckpt_to_keep=2 trainer.device=cpu \
    trainer.val_before_train=false "trainer.default_local_dir=$1"
}
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
steps_done() { [ -f "$1/metrics.jsonl" ] && wc -l <"$1/metrics.jsonl" || echo 0; }

# Calibrate: seconds per step (timing_s/step) from a 3-step run.
# shellcheck disable=SC2046
"$rpg" train $(args "$work/calib" 3) >/dev/null 2>"$work/calib.log" || { log "calibration run failed: $(tail -1 "$work/calib.log")"; exit 1; }
per_step=$(python3 -c "import json,sys; t=[json.loads(l)['timing_s/step'] for l in open(sys.argv[1])]; print(sum(t)/len(t))" "$work/calib/metrics.jsonl")
# The uninterrupted run takes about 80% of SOAK_SECONDS; the interrupted one about all of
# it (restarts load the model again and redo the steps after the last checkpoint).
steps=$(echo "s = $secs * 0.8 / $per_step; if (s < 6) 6 else s / 1" | bc)
log "about ${per_step}s per step: $steps steps for ${secs}s"

# The uninterrupted reference, its memory sampled after the first and the last step.
# shellcheck disable=SC2046
"$rpg" train $(args "$work/whole" "$steps") >/dev/null 2>"$work/whole.log" &
pid=$!
first_rss=0; last_rss=0
while kill -0 "$pid" 2>/dev/null; do
  n=$(steps_done "$work/whole")
  r=$(rss_kb "$pid")
  if [ "$n" -ge 1 ] && [ "$first_rss" = 0 ] && [ "$r" -gt 0 ]; then first_rss=$r; fi
  if [ "$n" -ge 1 ] && [ "$r" -gt 0 ]; then last_rss=$r; fi
  sleep 1
done
wait "$pid" || { log "uninterrupted run failed: $(tail -1 "$work/whole.log")"; exit 1; }
log "uninterrupted: $steps steps; RSS after step 1 ${first_rss} kB, at the end ${last_rss} kB"

# The interrupted run.
kills=0; terms=0; restarts=0; rss_list=(); rc=1
start=$(date +%s)
while true; do
  # shellcheck disable=SC2046
  "$rpg" train $(args "$work/soak" "$steps") >/dev/null 2>>"$work/soak.log" &
  pid=$!
  restarts=$((restarts + 1))
  gap=$((min_gap + RANDOM % (max_gap - min_gap + 1)))
  before=$(steps_done "$work/soak")
  waited=0
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$gap" ]; do sleep 1; waited=$((waited + 1)); done
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" && rc=0 || rc=$?
    [ "$rc" = 0 ] && break
    [ "$rc" = 75 ] && continue
    log "rpg train failed with exit $rc (see $work/soak.log)"; exit 1
  fi
  r=$(rss_kb "$pid")
  [ "$(steps_done "$work/soak")" -gt "$before" ] && rss_list+=("$r")
  if [ $((RANDOM % 2)) = 0 ]; then
    kill -KILL "$pid"; kills=$((kills + 1)); wait "$pid" || true
  else
    kill -TERM "$pid"; terms=$((terms + 1))
    wait "$pid" && rc=0 || rc=$?
    if [ "$rc" != 75 ] && [ "$rc" != 0 ]; then log "SIGTERM: exit $rc, expected 75 (see $work/soak.log)"; exit 1; fi
    [ "$rc" = 0 ] && break
  fi
done
elapsed=$(($(date +%s) - start))

# Checks.
fail=0; same=1
last="global_step_$steps"
for f in actor/model.safetensors train_state.safetensors; do
  cmp -s "$work/whole/$last/$f" "$work/soak/$last/$f" || { log "DIFFERENT: $last/$f"; same=0; fail=1; }
done
python3 - "$work/whole/metrics.jsonl" "$work/soak/metrics.jsonl" <<'PY' || { same=0; fail=1; }
import json, sys
def load(p):
    out = []
    for line in open(p):
        j = json.loads(line)
        out.append({k: v for k, v in j.items() if not k.startswith(("timing_s/", "perf/"))})
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
sys.exit(0 if a == b else print(f"metrics differ: {len(a)} vs {len(b)} steps") or 1)
PY
rss_ok=1
if [ ${#rss_list[@]} -gt 0 ]; then
  base=${rss_list[0]}
  for r in "${rss_list[@]}"; do
    [ "$((r * 100))" -le "$((base * 110))" ] || rss_ok=0
  done
fi
[ "$first_rss" -gt 0 ] && [ "$((last_rss * 100))" -le "$((first_rss * 110))" ] || rss_ok=0
[ "$rss_ok" = 1 ] || fail=1
summary="soak: ${elapsed}s interrupted run, $steps steps, $restarts starts ($kills SIGKILL, $terms SIGTERM); final weights and metrics $([ $same = 1 ] && echo equal || echo NOT equal) to the uninterrupted run; RSS at signal (kB): ${rss_list[*]:-none}; uninterrupted RSS step 1 -> end: $first_rss -> $last_rss kB; $([ $rss_ok = 1 ] && echo 'RSS within 10%' || echo 'RSS NOT within 10%')"
echo "$summary"
exit $fail
