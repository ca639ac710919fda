#!/usr/bin/env bash
# Checks the demo's claim on other seeds: `rpg demo --seed S` for each seed given (default
# 1 2 3), then the held-out improvement of each from its summary.json. Exits 1 when any seed
# improves by less than MIN_POINTS (default 15) percentage points. Not a CTest test: it takes
# about ten minutes per seed.
#
# Usage: scripts/demo_seeds.sh [SEED...]   (RPG=path/to/rpg, OUT=runs, MIN_POINTS=15)
set -euo pipefail
RPG=${RPG:-build/rpg}
OUT=${OUT:-runs}
MIN_POINTS=${MIN_POINTS:-15}
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(1 2 3)
failed=0
for s in "${seeds[@]}"; do
  "$RPG" demo --seed "$s" --out "$OUT/demo-seed-$s" --no-progress
  read -r before after points < <(python3 -c '
import json, sys
s = json.load(open(sys.argv[1]))
print(s["sft_accuracy"], s["rl_accuracy"], s["improvement_points"])' "$OUT/demo-seed-$s/summary.json")
  verdict=ok
  if ! python3 -c 'import sys; sys.exit(0 if float(sys.argv[1]) >= float(sys.argv[2]) else 1)' "$points" "$MIN_POINTS"; then
    verdict="FAILED (< $MIN_POINTS points)"
    failed=1
  fi
  echo "seed $s: held-out accuracy $before -> $after ($points points): $verdict"
done
exit $failed
