#!/usr/bin/env bash
# Checks the demo's claim beyond the machine it was tuned on: `rpg demo --seed S` for every
# CPU kernel family x thread count x seed, and the held-out improvement of each from its
# summary.json. libtorch's ATEN_CPU_CAPABILITY selects the kernel family (default, avx2,
# avx512: a family the CPU lacks is skipped and said so); OMP_NUM_THREADS the thread count.
# Prints a Markdown table (also written to OUT/demo-grid.md, with the CPU's model and flags)
# and exits 1 when any run improves by less than MIN_POINTS (default 15) percentage points.
# Not a CTest test: one run took 7.7-9.6 CPU minutes at one thread (AVX2; docs/demo-results.md).
# The load column is the 1-minute load average when the run started and ended: on a shared
# machine wall time measures the neighbours, CPU time what the run costs.
#
# Usage: scripts/demo_seeds.sh [SEED...]      (default seeds 0 1 2 3 4)
#   RPG=path/to/rpg  OUT=runs  MIN_POINTS=15  CAPS="default avx2 avx512"  THREADS="1 2"
#   DEMO_ARGS="..." (`rpg demo` options; default --from-scratch, the grid of docs/demo-results.md;
#   --model DIR for the real-model demo)
set -euo pipefail
RPG=${RPG:-build/rpg}
OUT=${OUT:-runs}
MIN_POINTS=${MIN_POINTS:-15}
CAPS=${CAPS:-default avx2 avx512}
THREADS=${THREADS:-1 2}
DEMO_ARGS=${DEMO_ARGS:---from-scratch}
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2 3 4)
mkdir -p "$OUT"
table="$OUT/demo-grid.md"

has_flag() { grep -qw "$1" /proc/cpuinfo; }
supported() {
  case "$1" in
    default) return 0 ;;
    avx2) has_flag avx2 ;;
    avx512) has_flag avx512f && has_flag avx512bw && has_flag avx512vl && has_flag avx512dq ;;
    *) echo "demo_seeds.sh: unknown capability '$1' (default, avx2, avx512)" >&2; exit 2 ;;
  esac
}

cpu=$(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -E '^(avx2|avx512f|avx512bw|avx512_bf16|avx512_vnni|amx_bf16|fma)$' | tr '\n' ' ')
{
  echo "# Demo grid: held-out accuracy (mean@8) before and after RL"
  echo
  echo "CPU: $cpu ($(nproc) cores; flags: ${flags:-none of avx2/avx512}). $(date -u +%Y-%m-%d)."
  echo "Command: \`scripts/demo_seeds.sh ${seeds[*]}\` (CAPS=\"$CAPS\", THREADS=\"$THREADS\"${DEMO_ARGS:+, DEMO_ARGS=\"$DEMO_ARGS\"})."
  echo
  echo "| kernels | threads | seed | SFT steps | SFT | RL steps | after RL | gain (points) | wall (min) | CPU (min) | load (start/end) |"
  echo "|---|---|---|---|---|---|---|---|---|---|---|"
} > "$table"

failed=0
for cap in $CAPS; do
  if ! supported "$cap"; then
    echo "| $cap | - | - | - | - | - | - | skipped: this CPU lacks $cap | - | - | - |" >> "$table"
    echo "skipping ATEN_CPU_CAPABILITY=$cap: this CPU lacks it" >&2
    continue
  fi
  for t in $THREADS; do
    for s in "${seeds[@]}"; do
      run="$OUT/demo-$cap-t$t-seed-$s"
      load0=$(cut -d' ' -f1 /proc/loadavg)
      # shellcheck disable=SC2086
      ATEN_CPU_CAPABILITY=$cap OMP_NUM_THREADS=$t "$RPG" demo --seed "$s" --out "$run" --no-progress $DEMO_ARGS \
        > "$run.log" 2>&1 || { echo "demo failed: see $run.log" >&2; failed=1; continue; }
      load1=$(cut -d' ' -f1 /proc/loadavg)
      row=$(python3 - "$run/summary.json" "$MIN_POINTS" "$load0/$load1" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
ok = s["improvement_points"] >= float(sys.argv[2])
print(f'| {s.get("cpu_capability", "?")} | {s.get("threads", "?")} | {s["seed"]} | {s.get("sft_steps", "?")} | '
      f'{s["sft_accuracy"]:.3f} | {s.get("rl_steps", "?")} | {s["rl_accuracy"]:.3f} | {s["improvement_points"]:+.1f}{"" if ok else " (FAILED)"} | '
      f'{s["wall_seconds"] / 60:.1f} | {s.get("cpu_seconds", float("nan")) / 60:.1f} | {sys.argv[3]} |')
sys.exit(0 if ok else 3)
EOF
) || failed=1
      echo "$row" >> "$table"
      echo "$row"
    done
  done
done
echo
echo "table: $table"
exit $failed
