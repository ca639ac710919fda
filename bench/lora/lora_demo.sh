#!/usr/bin/env bash
# Held-out gain of LoRA vs full fine-tuning at equal RL steps on the real-model demo
# (`rpg demo`: SmolLM2-135M-Instruct, synthetic "What is 47 + 8?" problems, 10 steps of
# RPG-REINFORCE-UFKL; README "The demo"), one after another in one run, same seed and data:
# full fine-tuning at the demo's lr, then LoRA rank R (alpha 2R) at each learning rate given.
# Prints a Markdown table of held-out mean@4 before / after, the gain and the minutes.
#
# usage: bench/lora/lora_demo.sh [SEED] [RANK] [LORA_LRS (comma-separated)] [OUT]
#   defaults: seed 0, rank 16, LoRA learning rates 2e-4,1e-3, OUT /tmp/rpg-lora-demo
set -euo pipefail
repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
rpg="$repo/build/rpg"
seed=${1:-0}
rank=${2:-16}
lrs=${3:-2e-4,1e-3}
out=${4:-/tmp/rpg-lora-demo}
model=$("$repo/scripts/get_model.sh" smollm2-135m-instruct)
mkdir -p "$out"
run() {  # name, extra demo flags...
  local name=$1
  shift
  local t0=$SECONDS
  (cd "$repo" && "$rpg" demo --model "$model" --seed "$seed" --out "$out/$name" --no-progress "$@") > "$out/$name.log" 2>&1
  local line
  line=$(grep "held-out accuracy (mean" "$out/$name.log" | tail -1)
  echo "$name|$line|$(( (SECONDS - t0) / 60 )).$(( (SECONDS - t0) % 60 * 10 / 60 ))"
}
rows=("$(run full)")
IFS=, read -ra lr_list <<< "$lrs"
for lr in "${lr_list[@]}"; do rows+=("$(run "lora_r${rank}_lr${lr}" --rl-lora-rank "$rank" --rl-lr "$lr")"); done
echo
echo "| run (seed $seed) | held-out mean@4 before -> after (gain) | minutes |"
echo "|---|---|---|"
for r in "${rows[@]}"; do
  IFS='|' read -r name line minutes <<< "$r"
  echo "| $name | ${line#*: } | $minutes |"
done
