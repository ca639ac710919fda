#!/usr/bin/env bash
# Long fuzzing campaigns (docs/robustness.md): each libFuzzer target until 1,000,000
# executions or 30 minutes, whichever first, one at a time at the lowest priority.
#   scripts/fuzz_campaign.sh BIN_DIR WORK_DIR [target...]
# BIN_DIR holds the fuzz_<name> binaries (build/tests/*/fuzz_*); WORK_DIR receives one
# corpus, log and crash-artifact directory per target. The seed corpora in the source tree
# are read, never written: new inputs go to WORK_DIR/<name>/corpus.
set -u
bin=${1:?BIN_DIR}; work=${2:?WORK_DIR}; shift 2
src=$(cd "$(dirname "$0")/.." && pwd)
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(config model_config reward records safetensors tokenizer_json encode chat_template parquet)
runs=${RPG_FUZZ_RUNS:-1000000}
secs=${RPG_FUZZ_MAX_SECONDS:-1800}
for t in "${targets[@]}"; do
  seed=$(ls -d "$src"/tests/*/fuzz_"$t"_corpus 2>/dev/null | head -1)
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  echo "== $t: $(date -u +%FT%TZ)" >&2
  ASAN_OPTIONS=detect_leaks=1 nice -n 19 "$bin/fuzz_$t" -runs="$runs" -max_total_time="$secs" -timeout=10 \
    -rss_limit_mb=4096 -print_final_stats=1 -artifact_prefix="$work/$t/artifacts/" \
    "$work/$t/corpus" ${seed:+"$seed"} >"$work/$t/log.txt" 2>&1
  echo "$t exit $? $(grep -E '^stat::number_of_executed_units|^#[0-9]+.*(DONE|cov)' "$work/$t/log.txt" | tail -2 | tr '\n' ' ')" >&2
done
