#!/usr/bin/env bash
# Soak test (docs/robustness.md): for SOAK_SECONDS (default 3600) of wall-clock time two CPU
# trainings of the same run run side by side:
#   - "whole": one process, never interrupted, its resident memory (VmRSS) sampled every
#     SOAK_SAMPLE seconds (default 10) with the step it is at -> WORK/rss_whole.tsv;
#   - "soak":  the same training SIGKILLed or SIGTERMed (coin flip) SOAK_MIN_GAP..SOAK_MAX_GAP
#     seconds after each start and restarted, over and over.
# Both are started with a step count they cannot reach; at the deadline both get a SIGTERM
# (preemption: they finish their step, checkpoint it and exit 75). The one behind is then
# resumed to the step of the one ahead (trainer.total_training_steps = that step; the
# schedule is constant, so the step count does not change the training). Then:
#   1. the final weights and training state are byte-identical, the per-step metrics
#      (wall-clock ones aside) equal;
#   2. memory over the long run (rss_verdict below): the peak RSS of the last tenth of the
#      whole run is within 10% of the peak of its first tenth, and the least-squares slope
#      of RSS over time, extrapolated over the run, is under 10% of it as well (no creep);
#   3. the RSS of every restarted process, sampled when it is signalled (after at least one
#      finished step), is within 10% of the first such sample.
#   scripts/soak.sh [WORK_DIR]
# Environment: RPG (binary, default build/rpg), SOAK_SECONDS, SOAK_SEED (random moments),
# SOAK_MIN_GAP / SOAK_MAX_GAP (seconds between a restart and its signal, default 5 / 40),
# SOAK_SAMPLE (seconds between RSS samples); SOAK_RSS_ONLY=<rss_whole.tsv> only judges a
# recorded memory series (check 2) and exits. Run it at low priority on a shared machine:
# `nice -n 19 scripts/soak.sh`. Exit 0 when every check passes; the summary lines are the
# result to record.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
rpg=${RPG:-$src/build/rpg}
work=${1:-$(mktemp -d /tmp/rpg-soak.XXXXXX)}
secs=${SOAK_SECONDS:-3600}
seed=${SOAK_SEED:-1}
min_gap=${SOAK_MIN_GAP:-5}
max_gap=${SOAK_MAX_GAP:-40}
sample=${SOAK_SAMPLE:-10}
unreachable=100000000
RANDOM=$seed
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
mkdir -p "$work"
log() { echo "[soak $(date -u +%T)] $*" >&2; }

# Memory over the long run, from the samples "seconds step rss_kb" after step 1. RSS swings
# within every step (tensors of a step are allocated and freed; glibc returns some of it),
# so single samples compare a trough with a crest: the judged quantities are the peak of
# the first tenth of the samples against the peak of the last tenth (a leak raises the
# peak; heap reuse only lifts the troughs towards it), and the least-squares slope
# extrapolated over the run; both must stay within 10% of the first peak. Prints the
# figures and 1 (pass) or 0 last.
rss_verdict() {
  python3 - "$1" <<'PY'
import statistics, sys
rows = [l.split("\t") for l in open(sys.argv[1]).read().splitlines()[1:]]
pts = [(float(t), float(r)) for t, s, r in rows if int(s) >= 1]
if len(pts) < 10:
    print("too few samples 0"); sys.exit()
n = len(pts); k = max(3, n // 10)
t0, t1 = pts[0][0], pts[-1][0]
mt = sum(t for t, _ in pts) / n; mr = sum(r for _, r in pts) / n
slope = sum((t - mt) * (r - mr) for t, r in pts) / sum((t - mt) ** 2 for t, _ in pts)  # kB/s
first = [r for _, r in pts[:k]]; last = [r for _, r in pts[-k:]]
p0, p1 = max(first), max(last)
drift = slope * (t1 - t0)
ok = p1 <= 1.10 * p0 and drift <= 0.10 * p0
print(f"{n} samples over {t1 - t0:.0f}s; first tenth min/median/peak {min(first):.0f}/{statistics.median(first):.0f}/{p0:.0f} kB, "
      f"last tenth {min(last):.0f}/{statistics.median(last):.0f}/{p1:.0f} kB (peak {100 * (p1 / p0 - 1):+.1f}%); "
      f"least-squares slope {slope * 3600:+.0f} kB/h ({100 * drift / p0:+.1f}% of the first peak over the run) {int(ok)}")
PY
}
if [ -n "${SOAK_RSS_ONLY:-}" ]; then  # evaluate a recorded rss_whole.tsv only
  v=$(rss_verdict "$SOAK_RSS_ONLY"); echo "soak: whole-run RSS: ${v% *}; $([ "${v##* }" = 1 ] && echo 'no creep' || echo CREEP)"
  [ "${v##* }" = 1 ]; exit
fi

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
for d in whole soak; do
  [ -e "$work/$d" ] && { log "$work/$d exists: use a fresh WORK_DIR (or remove it)"; exit 1; }
done
train_file=$(ls "$work"/data/*train*.parquet | head -1)
args() {  # $1 run dir, $2 steps
  echo - "actor_rollout_ref.model.path=$work/model" "data.train_files=$train_file" data.train_batch_size=4 \
    data.max_prompt_length=320 data.max_response_length=24 actor_rollout_ref.rollout.n=4 \
    actor_rollout_ref.actor.ppo_mini_batch_size=2 actor_rollout_ref.actor.policy_loss=rpg_reinforce \
    actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.optim.lr_scheduler_type=constant \
    actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0 actor_rollout_ref.actor.entropy_coeff=0.01 \
    actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.1 algorithm.adv_estimator=rpg_batch \
    "trainer.total_training_steps=$2" trainer.save_freq=3 trainer.max_actor_ckpt_to_keep=2 trainer.device=cpu \
    trainer.val_before_train=false "trainer.default_local_dir=$1"
}
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status" 2>/dev/null || echo 0; }
# Step records only: a checkpoint's timing_s/save_checkpoint record has no timing_s/step.
steps_done() { if [ -f "$1/metrics.jsonl" ]; then grep -c '"timing_s/step"' "$1/metrics.jsonl" || true; else echo 0; fi; }
# Exit code of a finished child; 0 and 75 (preempted) are expected.
reap() { rc=0; wait "$1" || rc=$?; }  # sets rc (not in a subshell: wait needs the parent)

# On any early exit, stop what this script started.
trap 'for p in $(jobs -p); do kill "$p" 2>/dev/null || true; done' EXIT
start=$(date +%s)
deadline=$((start + secs))

# The uninterrupted run and its memory sampler, in the background.
# shellcheck disable=SC2046
"$rpg" train $(args "$work/whole" "$unreachable") >/dev/null 2>"$work/whole.log" &
whole=$!
(
  printf 'seconds\tstep\trss_kb\n'
  while kill -0 "$whole" 2>/dev/null; do
    r=$(rss_kb "$whole")
    [ "$r" -gt 0 ] && printf '%s\t%s\t%s\n' "$(($(date +%s) - start))" "$(steps_done "$work/whole")" "$r"
    sleep "$sample"
  done
) >"$work/rss_whole.tsv" &
sampler=$!

# The interrupted run, until the deadline.
kills=0; terms=0; starts=0; rss_list=()
while [ "$(date +%s)" -lt "$deadline" ]; do
  # shellcheck disable=SC2046
  "$rpg" train $(args "$work/soak" "$unreachable") >/dev/null 2>>"$work/soak.log" &
  pid=$!
  starts=$((starts + 1))
  gap=$((min_gap + RANDOM % (max_gap - min_gap + 1)))
  left=$((deadline - $(date +%s)))
  [ "$gap" -gt "$left" ] && gap=$left
  [ "$gap" -lt "$min_gap" ] && gap=$min_gap  # the last start too gets its signal handlers in place
  before=$(steps_done "$work/soak")
  waited=0
  while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt "$gap" ]; do sleep 1; waited=$((waited + 1)); done
  if ! kill -0 "$pid" 2>/dev/null; then
    reap "$pid"; log "soak run ended by itself with exit $rc (see $work/soak.log)"; exit 1
  fi
  [ "$(date +%s)" -ge "$deadline" ] && break  # this one gets the final SIGTERM below
  r=$(rss_kb "$pid")
  [ "$(steps_done "$work/soak")" -gt "$before" ] && rss_list+=("$r")
  if [ $((RANDOM % 2)) = 0 ]; then
    kill -KILL "$pid"; kills=$((kills + 1)); wait "$pid" || true
  else
    kill -TERM "$pid"; terms=$((terms + 1))
    reap "$pid"
    [ "$rc" = 75 ] || { log "SIGTERM: exit $rc, expected 75 (see $work/soak.log)"; exit 1; }
  fi
done

# The deadline: preempt both (the whole run's only signal), each must exit 75.
kill -TERM "$whole"
reap "$whole"; [ "$rc" = 75 ] || { log "whole run: exit $rc after SIGTERM, expected 75 (see $work/whole.log)"; exit 1; }
wait "$sampler" || true
if kill -0 "$pid" 2>/dev/null; then
  kill -TERM "$pid"; terms=$((terms + 1))
  reap "$pid"; [ "$rc" = 75 ] || { log "soak run: exit $rc after SIGTERM, expected 75 (see $work/soak.log)"; exit 1; }
fi
elapsed=$(($(date +%s) - start))
n_whole=$(steps_done "$work/whole"); n_soak=$(steps_done "$work/soak")
target=$((n_whole > n_soak ? n_whole : n_soak))
log "deadline after ${elapsed}s: whole run at step $n_whole, interrupted run at step $n_soak; both to step $target"
resumed_whole=no
for d in whole soak; do
  if [ "$(steps_done "$work/$d")" -lt "$target" ]; then
    [ "$d" = whole ] && resumed_whole=yes
    # shellcheck disable=SC2046
    "$rpg" train $(args "$work/$d" "$target") >/dev/null 2>>"$work/$d.log" || { log "$d: finishing to step $target failed"; exit 1; }
  fi
done

# Checks.
fail=0; same=1
last="global_step_$target"
for f in actor/model.safetensors train_state.safetensors; do
  cmp -s "$work/whole/$last/$f" "$work/soak/$last/$f" || { log "DIFFERENT: $last/$f"; same=0; fail=1; }
done
python3 - "$work/whole/metrics.jsonl" "$work/soak/metrics.jsonl" <<'PY' || { same=0; fail=1; }
import json, sys
def load(p):
    out = []
    for line in open(p):
        j = json.loads(line)
        kept = {k: v for k, v in j.items() if not k.startswith(("timing_s/", "timing_per_token_ms/", "perf/"))}
        if len(kept) > 1:  # a checkpoint's record is only its step and timing_s/save_checkpoint
            out.append(kept)
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
sys.exit(0 if a == b else print(f"metrics differ: {len(a)} vs {len(b)} steps") or 1)
PY
creep=$(rss_verdict "$work/rss_whole.tsv")
creep_ok=${creep##* }; creep=${creep% *}
[ "$creep_ok" = 1 ] || fail=1
restart_ok=1
if [ ${#rss_list[@]} -gt 0 ]; then
  base=${rss_list[0]}
  for r in "${rss_list[@]}"; do [ "$((r * 100))" -le "$((base * 110))" ] || restart_ok=0; done
fi
[ "$restart_ok" = 1 ] || fail=1
echo "soak: ${elapsed}s, whole run step $n_whole (one process$([ $resumed_whole = yes ] && echo ', resumed once at the end to the interrupted run'\''s step')), interrupted run step $n_soak, both to step $target; $starts starts ($kills SIGKILL, $terms SIGTERM); final weights, training state and metrics $([ $same = 1 ] && echo equal || echo NOT equal)"
echo "soak: whole-run RSS: $creep; $([ "$creep_ok" = 1 ] && echo 'no creep (peak and drift within 10%)' || echo 'CREEP (over 10%)')"
echo "soak: RSS at each signal (kB): ${rss_list[*]:-none}; $([ $restart_ok = 1 ] && echo 'within 10% of the first' || echo 'NOT within 10% of the first')"
exit $fail
