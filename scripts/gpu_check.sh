#!/usr/bin/env bash
# The GPU check: one prepared run for a lent GPU machine (docs/benchmarks.md, "GPU").
#
#   scripts/gpu_check.sh --pack [--build DIR]     here: bundle the built binaries and the
#                                                 libraries the GPU machine lacks into
#                                                 .gpu/rpg-gpu.tar.xz (carried by the run tool)
#   scripts/gpu_check.sh [--out DIR]              there: unpack the bundle, then
#     1. check that every carried binary resolves its libraries (libtorch from that
#        machine's own torch: same torch version required, checked),
#     2. run the device-generic tests on CUDA only (RPG_TEST_DEVICES=cuda: an unusable GPU
#        fails the run, it never skips) and the device-selection tests,
#     3. run `rpg train` end to end on the device (fp32 and bf16, 4 steps, a tiny task packed
#        here: the front binary, the Parquet reader, validation, a checkpoint, perf metrics),
#     4. measure a training step (forward + backward of the token log-probs; MFU from
#        verl's FLOP formula) and decode tokens/s of a random Qwen2 of the Qwen2.5-0.5B and
#        1.5B shapes in bf16 (decode also in fp32 for the first shape), rpg
#        (bench/gpu/gpu_bench.cpp) next to transformers in the same venv
#        (bench/gpu/hf_bench.py); padded vs packed training on a mixed-length batch; decode
#        steps and the whole engine eager vs replayed from a CUDA graph,
#     5. run a full RL step of `rpg train` next to TRL's GRPOTrainer (bench/trl_step/; TRL,
#        datasets, dill and multiprocess carried as wheels, installed under the temp dir),
#     6. write one results file, $OUT/gpu_check.md (tables + the raw JSON lines).
#   scripts/gpu_check.sh --cpu-dry-run [--build DIR]   here, as a CTest: the same steps on
#                                                 the CPU (pack, unpack into a temp dir, the
#                                                 library check, the tests on cpu, the tiny
#                                                 shape, the results file) so that the first
#                                                 lent GPU is not spent on a script bug.
#
# Building on the GPU machine is not attempted: it has cmake, ninja and a compiler but none
# of the -dev packages (yaml-cpp, ICU, GoogleTest headers), and a full build does not fit
# the 8 minutes. The bundle carries the runtime libraries that ldd shows outside libtorch and
# the C/C++ runtime (yaml-cpp, ICU) instead.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mode=gpu
build="$here/build"
out="${OUT:-}"
bundle="$here/.gpu/rpg-gpu.tar.xz"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --pack) mode=pack ;;
    --cpu-dry-run) mode=dry ;;
    --build) build="$(cd "$2" && pwd)"; shift ;;
    --out) out="$2"; shift ;;
    --bundle) bundle="$2"; shift ;;
    -h|--help) sed -n '2,32p' "$0"; exit 0 ;;
    *) echo "gpu_check: error: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
  shift
done

say() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" >&2; }
die() { echo "gpu_check: error: $*" >&2; exit 1; }

BINARIES=(tests/model/model_tests tests/rollout/rollout_tests tests/dist/dist_tests bench/gpu/gpu_bench rpg rpg-torch)

# The Python that holds torch (+ transformers): the GPU machine's python3, or the venv here.
pick_python() {
  if [[ -n "${RPG_PYTHON:-}" && -x "${RPG_PYTHON}" ]]; then echo "$RPG_PYTHON"
  elif [[ -x "$here/.venv/bin/python" ]]; then echo "$here/.venv/bin/python"
  else command -v python3 || die "no python3"; fi
}

# --- pack: here ----------------------------------------------------------------------------
pack() {  # pack <bundle path>
  local dest="$1" stage
  stage="$(mktemp -d)"
  mkdir -p "$stage/rpg-gpu/bin" "$stage/rpg-gpu/lib"
  local torch_lib
  torch_lib="$("$(pick_python)" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
  for b in "${BINARIES[@]}"; do
    [[ -x "$build/$b" ]] || die "$build/$b is not built (cmake --build $build --target $(basename "$b"))"
    strip --strip-debug -o "$stage/rpg-gpu/bin/$(basename "$b")" "$build/$b"
    # Libraries outside libtorch's directory and the C/C++ runtime travel with the binaries.
    ldd "$build/$b" | awk '/=> \//{print $3}' | while read -r lib; do
      case "$(basename "$lib")" in
        libc.so*|libm.so*|libpthread.so*|libdl.so*|librt.so*|ld-linux*|libgcc_s.so*|libstdc++.so*) continue ;;
      esac
      [[ "$(dirname "$(readlink -f "$lib")")" == "$(readlink -f "$torch_lib")" ]] && continue
      cp -nL "$lib" "$stage/rpg-gpu/lib/" 2>/dev/null || true
    done
  done
  # The CUDA plugin (CUDA graphs): next to the binaries, where core/device.cpp looks for it.
  if [[ -f "$build/librpg_cuda.so" ]]; then
    strip --strip-debug -o "$stage/rpg-gpu/bin/librpg_cuda.so" "$build/librpg_cuda.so"
  elif [[ $mode != dry ]]; then
    die "$build/librpg_cuda.so is not built (cmake --build $build --target rpg_cuda)"
  fi
  # A tiny task for `rpg train` on the device (step 3 there), made here by rpg itself: the
  # demo's sums of three digits, a 512-token BPE tokenizer, a 2-layer Qwen2.
  local fx="$stage/rpg-gpu/fixture"
  "$build/rpg" data synth --seed 0 --train 64 --val 8 --test 8 --min-difficulty 0 --max-difficulty 0 "$fx/data"
  "$(pick_python)" -c 'import json, sys
for l in open(sys.argv[1]):
    j = json.loads(l); print((j["prompt"] + " " + j["response"]).replace("\n", " "))' "$fx/data/train_sft.jsonl" > "$fx/corpus.txt"
  "$build/rpg" tokenizer train --corpus "$fx/corpus.txt" --vocab-size 512 --output "$fx/tokenizer"
  "$build/rpg" model init --tokenizer "$fx/tokenizer" --output "$fx/model" --hidden 64 --layers 2 --heads 4 \
    --kv-heads 2 --intermediate 128
  # TRL and what it needs beyond the GPU image (datasets, dill, multiprocess), at this venv's
  # versions, as Python 3.12 wheels for the TRL side by side there (not for the dry run:
  # this venv has them; a failed download only drops that part).
  if [[ $mode == pack ]]; then
    local pins
    pins="$("$(pick_python)" -c 'import importlib.metadata as m
print(" ".join(f"{p}=={m.version(p)}" for p in ("trl", "datasets", "dill", "multiprocess")))')"
    # shellcheck disable=SC2086  # one argument per pin
    if ! "$(pick_python)" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
         --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
         -d "$stage/rpg-gpu/wheels" $pins; then
      say "pip download of $pins failed: the GPU run will skip the TRL side by side"
      rm -rf "$stage/rpg-gpu/wheels"
    fi
  fi
  "$(pick_python)" -c 'import torch; print(torch.__version__)' > "$stage/rpg-gpu/torch_version"
  git -C "$here" rev-parse HEAD > "$stage/rpg-gpu/commit" 2>/dev/null || echo unknown > "$stage/rpg-gpu/commit"
  mkdir -p "$(dirname "$dest")"
  XZ_OPT="${XZ_OPT:--6 -T0}" tar -C "$stage" -cJf "$dest.tmp" rpg-gpu
  mv "$dest.tmp" "$dest"
  rm -rf "$stage"
  say "bundle $dest: $(du -h "$dest" | cut -f1) ($(tar -tJf "$dest" | grep -c /lib/.) libraries)"
}

if [[ $mode == pack ]]; then
  pack "$bundle"
  exit 0
fi

# --- run: on the GPU machine (or the dry run here) -----------------------------------------
py="$(pick_python)"
work="$(mktemp -d /tmp/rpg-gpu-check.XXXXXX)"
trap 'rm -rf "$work"' EXIT
if [[ $mode == dry ]]; then
  bundle="$work/rpg-gpu.tar.xz"
  XZ_OPT="-0 -T0" pack "$bundle"
  [[ -n "$out" ]] || out="$work/out"
  device=cpu; shapes=(tiny); test_devices=cpu
  train_args=(--batch 2 --seq 64 --steps 2 --warmup 1 --chunk 64)
  decode_args=(--batch 4 --prompt-len 8 --new-tokens 8)
  trl_args=(--steps 2 --rounds 1 --prompts 2 --n 2 --max-new-tokens 8)
  test_filter='*MatchesCpu.*:*OnDevice.*:*EngineTest.GreedyEqualsTransformersGenerate/*:DeviceSelection.*'
else
  [[ -f "$bundle" ]] || die "no bundle at $bundle: run 'scripts/gpu_check.sh --pack' here first and carry .gpu"
  [[ -n "$out" ]] || die "no --out and no \$OUT"
  device=cuda; shapes=(0.5b 1.5b); test_devices=cuda
  train_args=(--batch 8 --seq 1024 --steps 5 --warmup 2 --chunk 1024)
  decode_args=(--batch 64 --prompt-len 128 --new-tokens 256)
  trl_args=(--steps 3 --rounds 1)  # the CPU side by side's shapes: 16 prompts x 8 x 64 tokens, fp32
  # Every CUDA instance of the device-generic tests, and the device-selection tests.
  test_filter='*cuda*:DeviceSelection.*'
fi
mkdir -p "$out"
results="$out/gpu_check.md"
raw="$work/raw.jsonl"
: > "$raw"
log="$work/log.txt"

# tar's xz filter needs the xz program; Python's tarfile (lzma) does without.
tar -C "$work" -xJf "$bundle" 2>/dev/null ||
  "$py" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' "$bundle" "$work"
root="$work/rpg-gpu"
torch_lib="$("$py" -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
torch_here="$("$py" -c 'import torch; print(torch.__version__)')"
torch_built="$(cat "$root/torch_version")"
# The C++ ABI of libtorch changes between releases: the bundle needs the same torch release
# (a different CUDA suffix, +cu130 vs +cu128, is fine for the CPU libraries it links).
[[ "${torch_here%%+*}" == "${torch_built%%+*}" ]] || die "bundle built against torch $torch_built, this python has $torch_here"
export LD_LIBRARY_PATH="$torch_lib:$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
for b in "$root"/bin/*; do
  if ldd "$b" | grep -q "not found"; then
    ldd "$b" | grep "not found" >&2
    die "$(basename "$b"): libraries not found (above)"
  fi
done
say "bundle $(cat "$root/commit"), torch $torch_here from $torch_lib, device $device"

status=0
# One budget for everything (the lease gives 8 minutes to the whole check): each step's
# timeout is the smaller of its own cap and what is left; a step with < 15 s left is
# skipped and counts as a failure.
default_budget=480
if [[ $mode == dry ]]; then default_budget=800; fi  # 2 shared cores here, not 16
deadline=$((SECONDS + ${RPG_GPU_CHECK_BUDGET:-$default_budget}))
budget() {  # budget <cap seconds> -> seconds to give the next step (0: skip it)
  local left=$((deadline - SECONDS))
  if ((left < 15)); then echo 0; elif ((left < $1)); then echo "$left"; else echo "$1"; fi
}
# 1. The tests. Oracles (transformers) run under this python; fixtures go to the temp dir.
mkdir -p "$work/build"
# The CLI half of the device-selection tests runs the carried rpg (the front binary execs
# rpg-torch from its own directory, where the CUDA plugin is too).
ln -s "$root/bin/rpg" "$work/build/rpg"; ln -s "$root/bin/rpg-torch" "$work/build/rpg-torch"
for t in model_tests rollout_tests dist_tests; do
  say "tests: $t ($test_filter, RPG_TEST_DEVICES=$test_devices)"
  limit=$(budget 150)
  if ((limit > 0)) && RPG_TEST_DEVICES=$test_devices RPG_TEST_SOURCE_DIR="$here" RPG_TEST_BINARY_DIR="$work/build" \
     RPG_TEST_PYTHON="$py" OMP_NUM_THREADS=4 \
     timeout "$limit" "$root/bin/$t" --gtest_filter="$test_filter" --gtest_brief=1 > "$work/$t.log" 2>&1 &&
     ! grep -q '^\[  PASSED  \] 0 tests' "$work/$t.log"; then  # a filter that matches nothing fails
    echo "{\"tests\": \"$t\", \"result\": \"pass\", \"summary\": \"$(grep -E '^\[  PASSED  \]' "$work/$t.log" | head -1)\"}" >> "$raw"
  else
    status=1
    echo "{\"tests\": \"$t\", \"result\": \"FAIL\", \"summary\": \"see the log below\"}" >> "$raw"
    { echo "--- $t (timeout ${limit}s)"; tail -60 "$work/$t.log" 2>/dev/null; } >> "$log"
  fi
done

# 2. `rpg train` end to end on the device (the front binary, rpg-torch, the CUDA plugin, the
# Parquet reader), fp32 and bf16 (rollout and compute; CUDA-graph decode), 4 steps with validation and a
# checkpoint: every step's loss finite and gradient non-zero, and the trainer's own perf
# metrics there (on CUDA: MFU from the device's name, the allocator's peaks).
train_run() {  # train_run <label> <overrides...>
  local label="$1"; shift
  local run="$work/train_$label" fx="$root/fixture" limit
  say "train: $label"
  limit=$(budget 90)
  if ((limit > 0)) && timeout "$limit" "$root/bin/rpg" train - "actor_rollout_ref.model.path=$fx/model" \
       "data.train_files=$fx/data/train.parquet" "data.val_files=$fx/data/validation.parquet" \
       data.train_batch_size=8 data.max_prompt_length=256 data.max_response_length=48 actor_rollout_ref.rollout.n=4 \
       actor_rollout_ref.actor.ppo_mini_batch_size=4 actor_rollout_ref.actor.policy_loss=rpg_reinforce \
       algorithm.adv_estimator=rpg actor_rollout_ref.actor.optim.lr=1e-3 actor_rollout_ref.actor.entropy_coeff=0.01 \
       actor_rollout_ref.actor.use_kl_loss=true actor_rollout_ref.actor.kl_loss_coef=0.1 \
       trainer.total_training_steps=4 trainer.save_freq=2 trainer.test_freq=2 "trainer.device=$device" \
       "trainer.default_local_dir=$run" "$@" > "$work/train_$label.log" 2>&1 &&
     "$py" - "$run/metrics.jsonl" "$label" "$device" "$work/train_$label.log" >> "$raw" 2>> "$log" <<'PY'
import json, math, sys
path, label, device, output = sys.argv[1:5]
records = [json.loads(l) for l in open(path)]
steps = [r for r in records if "timing_s/step" in r]
bad = [r["step"] for r in steps if not math.isfinite(r.get("actor/pg_loss") or math.nan)
       or not (r.get("actor/grad_norm") or 0) > 0]
need = ["perf/mfu/actor", "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb"] if device == "cuda" else []
missing = sorted({k for r in steps for k in need if not (r.get(k) or 0) > 0})
saves = [r["step"] for r in records if "timing_s/save_checkpoint" in r]
last = steps[-1] if steps else {}
# The bf16 run sets enforce_eager=false: on CUDA the trainer must say it decodes from a graph.
graph = "decode steps replayed from a CUDA graph" in open(output).read()
if device == "cuda" and label == "bf16" and not graph: missing.append("CUDA-graph decode (no log line)")
ok = len(steps) == 4 and not bad and not missing and saves == [2, 4]
print(json.dumps({"train": label, "result": "pass" if ok else "FAIL", "steps": len(steps), "bad_steps": bad,
                  "missing": missing, "saves": saves, "cuda_graph_decode": graph,
                  "seconds_per_step": sum(r["timing_s/step"] for r in steps[1:]) / max(1, len(steps) - 1),
                  **{k: last.get(k) for k in ("critic/score/mean", "actor/pg_loss", "perf/mfu/actor",
                                              "perf/max_memory_allocated_gb", "perf/max_memory_reserved_gb",
                                              "perf/throughput")}}))
sys.exit(0 if ok else 1)
PY
  then :
  else
    status=1
    echo "{\"train\": \"$label\", \"result\": \"FAIL\", \"timeout_s\": $limit}" >> "$raw"
    { echo "--- rpg train $label"; tail -40 "$work/train_$label.log" 2>/dev/null; } >> "$log"
  fi
}
train_run fp32
# bf16 also with the paper scripts' enforce_eager=false: decode steps replayed from a CUDA graph.
train_run bf16 actor_rollout_ref.rollout.dtype=bfloat16 actor_rollout_ref.actor.compute_dtype=bfloat16 \
  actor_rollout_ref.rollout.enforce_eager=false

# 3.-4. The benchmarks, each side in its own process, interleaved per shape.
bench() {  # bench <label> <command...>
  local label="$1"; shift
  say "bench: $label"
  local limit
  limit=$(budget 120)
  if ((limit == 0)) || ! timeout "$limit" "$@" >> "$raw" 2>> "$log"; then
    status=1
    echo "{\"bench\": \"$label\", \"result\": \"FAIL\", \"timeout_s\": $limit}" >> "$raw"
  fi
}
for shape in "${shapes[@]}"; do
  common=(--shape "$shape" --device "$device" --dtype bf16)
  bench "rpg train $shape" "$root/bin/gpu_bench" "${common[@]}" --what train "${train_args[@]}"
  bench "transformers train $shape" "$py" "$here/bench/gpu/hf_bench.py" "${common[@]}" --what train "${train_args[@]}"
  bench "rpg packed $shape" "$root/bin/gpu_bench" "${common[@]}" --what packed "${train_args[@]}"
  bench "rpg decode $shape" "$root/bin/gpu_bench" "${common[@]}" --what decode "${decode_args[@]}"
  bench "transformers decode $shape" "$py" "$here/bench/gpu/hf_bench.py" "${common[@]}" --what decode "${decode_args[@]}"
  bench "rpg graph decode $shape" "$root/bin/gpu_bench" "${common[@]}" --what graph "${decode_args[@]}"
  bench "rpg engine $shape" "$root/bin/gpu_bench" "${common[@]}" --what engine "${decode_args[@]}"
  if [[ $shape == "${shapes[0]}" ]]; then  # the same dtype on both sides in fp32 too (issue 17, 6b)
    fp32=(--shape "$shape" --device "$device" --dtype fp32)
    bench "rpg decode fp32 $shape" "$root/bin/gpu_bench" "${fp32[@]}" --what decode "${decode_args[@]}"
    bench "transformers decode fp32 $shape" "$py" "$here/bench/gpu/hf_bench.py" "${fp32[@]}" --what decode "${decode_args[@]}"
  fi
done

# 5. A full RL step, rpg train next to TRL's GRPOTrainer on the device (bench/trl_step/, the
# CPU benchmark's model and shapes, fp32), TRL from the carried wheels.
say "bench: rpg train vs TRL GRPOTrainer"
site=""
if [[ -d "$root/wheels" ]] && "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
     --target "$work/site" "$root"/wheels/*.whl >> "$log" 2>&1; then
  site="$work/site"
fi
limit=$(budget 150)
if ((limit > 0)) && PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" timeout "$limit" "$py" \
     "$here/bench/trl_step/trl_step_bench.py" --rpg "$root/bin/rpg" --device "$device" --json "${trl_args[@]}" \
     > "$work/trl.log" 2>&1 && grep -q '^{"bench": "trl_step"' "$work/trl.log"; then
  grep '^{"bench": "trl_step"' "$work/trl.log" >> "$raw"
else
  status=1
  echo "{\"bench\": \"trl_step\", \"result\": \"FAIL\", \"timeout_s\": $limit}" >> "$raw"
  { echo "--- trl_step_bench (timeout ${limit}s)"; tail -30 "$work/trl.log" 2>/dev/null; } >> "$log"
fi

# 6. One results file.
gpu_name="$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 || true)"
"$py" - "$raw" "$results" "$log" "${gpu_name:-none}" "$(cat "$root/commit")" "$mode" <<'PY'
import json, sys, datetime
raw, results, log, gpu, commit, mode = sys.argv[1:7]
rows = [json.loads(l) for l in open(raw) if l.strip()]
# verl's FLOP estimate for Qwen2 (verl/utils/flops_counter.py): 6 * dense params * tokens
# (embedding and lm_head counted) + 12 * sum(seqlen^2) * head_dim * heads * layers.
SHAPES = {"0.5b": (151936, 896, 4864, 24, 14, 2), "1.5b": (151936, 1536, 8960, 28, 12, 2),
          "tiny": (512, 64, 128, 2, 4, 2)}
# Dense bf16 peak by the name nvidia-smi gives, as the trainer's perf/mfu/actor takes it (verl's
# table, src/rpg/train/perf_metrics.cpp): the lent kinds, an H100 80GB HBM3 and an H200, are
# both 989 (KINDS.md measured ~790-800 on random data there). Another GPU gets no MFU column
# rather than a wrong one; the CPU dry run any number.
PEAK = 989.4e12 if gpu == "none" or any(k in gpu for k in ("H100", "H200", "H800")) else None
def flops_per_step(shape, batch, seq):
    V, C, I, L, H, Hkv = SHAPES[shape]
    d = C // H
    attn = C * (H * d + 2 * Hkv * d + H * d)
    dense = (3 * C * I + attn) * L + 2 * V * C
    return 6 * dense * batch * seq + 12 * batch * seq * seq * d * H * L
out = [f"# rpg GPU check ({mode})", "",
       f"{datetime.datetime.utcnow():%Y-%m-%d %H:%M} UTC, GPU: {gpu}, commit {commit}", "",
       "## Tests", ""]
for r in rows:
    if "tests" in r: out.append(f"- {r['tests']}: **{r['result']}** {r['summary']}")
out += ["", "## rpg train on the device (4 steps, tiny model; the last step's metrics)", ""]
for r in rows:
    if "train" in r: out.append(f"- {r['train']}: **{r['result']}** " + json.dumps({k: v for k, v in r.items() if k not in ("train", "result")}))
def find(impl, what, shape, dtype="bf16"):
    for r in rows:
        if r.get("impl") == impl and r.get("what") == what and r.get("shape") == shape and r.get("dtype") == dtype:
            return r
shapes_run = [s for s in SHAPES if any(r.get("shape") == s for r in rows)]
# One table of rpg next to transformers: cells(r) gives the middle columns of a row.
def side_by_side(title, columns, what, cells, dtype="bf16"):
    out.extend(["", title, "", "| shape | impl | " + " | ".join(columns) + " | rpg / transformers |",
                "|---|---|" + "---|" * (len(columns) + 1)])
    for shape in shapes_run:
        if dtype != "bf16" and not any(r.get("shape") == shape and r.get("dtype") == dtype for r in rows): continue
        for impl in ("rpg", "transformers"):
            r = find(impl, what, shape, dtype)
            if not r: out.append(f"| {shape} | {impl} | FAILED |" + " |" * len(columns)); continue
            o = find("transformers", what, shape, dtype)
            ratio = f"{r['tokens_per_second'] / o['tokens_per_second']:.2f}x" if impl == "rpg" and o else ""
            out.append(f"| {shape} | {impl} | {cells(r)} | {ratio} |")
side_by_side("## Training step (forward + backward of token log-probs, bf16)",
             ["tokens/step", "s/step", "tokens/s", f"MFU (of {PEAK / 1e12:.0f} TFLOP/s; meaningless on a CPU)" if PEAK else "MFU (unknown GPU peak)", "peak GiB allocated"],
             "train",
             lambda r: f"{r['batch'] * r['seq']} | {r['seconds_per_step']:.4f} | {r['tokens_per_second']:.0f} | "
                       + (f"{100 * flops_per_step(r['shape'], r['batch'], r['seq']) / r['seconds_per_step'] / PEAK:.1f}% | "
                          if PEAK else "- | ")
                       + (f"{r['max_memory_allocated_gb']:.2f}" if "max_memory_allocated_gb" in r else "-"))
side_by_side("## Decode (sampling, no stop token, bf16)", ["prompts x new tokens", "s", "tokens/s"], "decode",
             lambda r: f"{r['batch']} x {r['new_tokens']} | {r['seconds']:.2f} | {r['tokens_per_second']:.0f}")
side_by_side("## Decode in fp32 (first shape only)", ["prompts x new tokens", "s", "tokens/s"], "decode",
             lambda r: f"{r['batch']} x {r['new_tokens']} | {r['seconds']:.2f} | {r['tokens_per_second']:.0f}", "fp32")
out += ["", "## Training step on a mixed-length batch (lengths vary 4x), padded vs packed (use_remove_padding), bf16", "",
        "| shape | rows x width | real tokens | padded tokens/s | packed tokens/s | packed / padded |", "|---|---|---|---|---|---|"]
for shape in shapes_run:
    r = find("rpg", "packed", shape)
    if not r: out.append(f"| {shape} | FAILED | | | | |"); continue
    out.append(f"| {shape} | {r['batch']} x {r['width']} | {r['real_tokens']} | {r['padded_tokens_per_second']:.0f} | "
               f"{r['packed_tokens_per_second']:.0f} | {r['speedup']:.2f}x |")
out += ["", "## Decode steps with fixed shapes (decode_all_slots, greedy): eager vs CUDA graph replay", "",
        "| shape | slots x steps | eager tokens/s | graph tokens/s | speedup | same tokens |", "|---|---|---|---|---|---|"]
for shape in shapes_run:
    r = find("rpg", "graph", shape)
    if not r: out.append(f"| {shape} | FAILED | | | | |"); continue
    g = r.get("graph_tokens_per_second")
    out.append(f"| {shape} | {r['batch']} x {r['steps']} | {r['eager_tokens_per_second']:.0f} | "
               + (f"{g:.0f} | {r['graph_speedup']:.2f}x | {r['graph_equals_eager']} |" if g else f"{r.get('graph')} | | |"))
out += ["", "## The rollout engine, greedy: eager steps over the active rows vs fixed-slot steps from a CUDA graph "
        "(enforce_eager=false; fixed-slot eager on a CPU)", "",
        "| shape | prompts x new tokens | eager tokens/s | fixed-slot tokens/s | CUDA graph (graphs captured) "
        "| share of the cache attended | speedup | identical responses |",
        "|---|---|---|---|---|---|---|---|"]
for shape in shapes_run:
    r = find("rpg", "engine", shape)
    if not r: out.append(f"| {shape} | FAILED | | | | | | |"); continue
    out.append(f"| {shape} | {r['batch']} x {r['new_tokens']} | {r['eager_tokens_per_second']:.0f} | "
               f"{r['fixed_tokens_per_second']:.0f} | {r['cuda_graph']} ({r['graphs_captured']}) | "
               f"{r['attended_share']:.2f} | {r['speedup']:.2f}x | {r['identical_responses']}/{r['responses']} |")
out += ["", "## Full RL step: rpg train vs TRL's GRPOTrainer (GRPO, fp32; bench/trl_step)", ""]
for r in rows:
    if r.get("bench") == "trl_step" and "ratio" in r:
        out.append(f"- {r['variant']}: {r['prompts']} prompts x n={r['n']} x {r['max_new_tokens']} tokens on {r['device']}: "
                   f"rpg {r['rpg_seconds_per_step']:.3f} s/step, TRL {r['trl_version']} {r['trl_seconds_per_step']:.3f} "
                   f"s/step: **{r['ratio']:.2f}x**; rpg's phases " +
                   ", ".join(f"{k} {v:.3f}" for k, v in r["rpg_phases"].items()))
    elif r.get("bench") == "trl_step":
        out.append("- FAILED (see the log)")
out += ["", "## Attention kernels rpg ran (scaled_dot_product_attention; math = unfused fallback)", ""]
for r in rows:
    if r.get("impl") == "rpg":
        out.append(f"- {r['what']} {r['shape']} {r.get('dtype', '')}: " + ", ".join(f"{k} -> {v}" for k, v in sorted(r.get("sdpa", {}).items())))
out += ["", "## Raw", "", "```"] + [json.dumps(r) for r in rows] + ["```"]
err = open(log).read().strip()
if err: out += ["", "## Log (stderr, failed test output)", "", "```", err[-12000:], "```"]
open(results + ".tmp", "w").write("\n".join(out) + "\n")
import os; os.replace(results + ".tmp", results)
PY
say "results: $results"
cat "$results"
exit $status
