"""How one RL step's time grows with the work: response length and batch (issue 35, item 3).

  .venv/bin/python bench/roofline/scaling.py MODEL_DIR [--lengths 128,256,512,1024] [--batches 8,16,32,64]
      [--base-batch 8] [--base-length 128] [--prompt-len 64] [--threads 2] [--checkpointing 1] [--json FILE]

Each grid point runs roofline_bench (rpg, a child process of its own: its peak RSS is the
point's) on B sequences of a --prompt-len prompt and L response tokens, cold (no warm-up, one
timed run, as a training step meets its shapes):
  rollout   decode of B sequences, L new tokens each, EOS ignored (plus the prefill)
  logprob   one no-grad pass over B rows of prompt + L (old log-probs; the reference's is the same)
  update    the actor's pass with autograd and backward (gradient checkpointing by default, as a
            long-response run uses it)
step = rollout + 2 x logprob + update. The FLOPs of each phase come from flops.py (the same
model as roofline.py); a phase whose GFLOP/s stays flat while its work grows has no
super-linear cost beyond its FLOPs (attention's L^2 term is in the FLOPs). "x work" and
"x time" are relative to the first point of each sweep.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_run import run_bench, sweep_arguments  # noqa: E402
from flops import ModelWork  # noqa: E402

ap = sweep_arguments(lengths="128,256,512,1024", batches="8,16,32,64", base_length=128)
ap.add_argument("--checkpointing", type=int, default=1)
ap.add_argument("--json", help="also write every measurement to this file")
args = ap.parse_args()
MW = ModelWork(args.model, 4)


def point(batch, length):
    argv = [args.bench, "--model", args.model, "--threads", str(args.threads), "--phases", "decode,logprob,update",
            "--decode-seqs", str(batch), "--new-tokens", str(length), "--prompt-len", str(args.prompt_len),
            "--rows", str(batch), "--response", str(length), "--repeats", "1", "--warmup", "0",
            "--checkpointing", str(args.checkpointing)]
    lines, rss_mib = run_bench(argv)
    ms = {m["phase"]: m for m in lines}
    # decode's seconds exclude the prefill (generate(L) - generate(1)); the rollout is generate(L).
    rollout_s = ms["decode"]["generate_seconds"]
    rollout_flops = MW.work(ms["decode"])[0] + MW.forward_flops(batch * args.prompt_len,
                                                                batch * MW.causal_keys(args.prompt_len), batch)
    out = {"batch": batch, "length": length, "rss_mib": rss_mib,
           "rollout": (rollout_s, rollout_flops),
           "logprob": (ms["logprob"]["seconds"], MW.work(ms["logprob"])[0]),
           "update": (ms["update"]["seconds"], MW.work(ms["update"])[0])}
    out["step"] = (out["rollout"][0] + 2 * out["logprob"][0] + out["update"][0],
                   out["rollout"][1] + 2 * out["logprob"][1] + out["update"][1])
    print(f"  B={batch} L={length}: " + ", ".join(f"{k} {out[k][0]:.1f} s" for k in ("rollout", "logprob", "update", "step")),
          file=sys.stderr, flush=True)
    return out


def table(title, points):
    print(f"\n{title}\n")
    print("| B | L | tokens | rollout s (GFLOP/s) | logprob s (GFLOP/s) | update s (GFLOP/s) | step s | x work | x time | peak RSS MiB |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = points[0]
    for p in points:
        cells = [f"{p[k][0]:.1f} ({p[k][1] / p[k][0] / 1e9:.0f})" for k in ("rollout", "logprob", "update")]
        work_x = p["step"][1] / base["step"][1]
        time_x = p["step"][0] / base["step"][0]
        rss = f"{p['rss_mib']:.0f}"
        print(f"| {p['batch']} | {p['length']} | {p['batch'] * (args.prompt_len + p['length'])} | " + " | ".join(cells)
              + f" | {p['step'][0]:.1f} | {work_x:.2f} | {time_x:.2f} | {rss} |")


lengths = [int(x) for x in args.lengths.split(",")]
batches = [int(x) for x in args.batches.split(",")]
print(f"model {os.path.basename(os.path.normpath(args.model))}: {MW.L} layers, hidden {MW.C}, heads {MW.H}/{MW.Hkv}, "
      f"intermediate {MW.I}, vocab {MW.V}; prompt {args.prompt_len}, {args.threads} threads, fp32, "
      f"gradient checkpointing {'on' if args.checkpointing else 'off'}")
by_length = [point(args.base_batch, n) for n in lengths]
by_batch = [point(b, args.base_length) for b in batches]
table(f"Response length (B = {args.base_batch})", by_length)
table(f"Batch (L = {args.base_length})", by_batch)
if args.json:
    with open(args.json, "w") as f:
        json.dump({"by_length": by_length, "by_batch": by_batch}, f, indent=1)
