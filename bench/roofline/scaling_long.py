"""The issue's full scaling ranges (issue 35, item 3: responses to 4096 tokens, batches to 512
sequences) on a 2-core CPU, from measured parts: what one RL step's phases cost, per decode
step and per sequence, at every shape they meet.

  .venv/bin/python bench/roofline/scaling_long.py MODEL_DIR [--lengths 256,512,1024,2048,4096]
      [--batches 8,32,128,512] [--base-batch 8] [--base-length 256] [--prompt-len 64] [--n 8]
      [--max-num-seqs 256] [--kv-fraction 0.8] [--micro-tokens 4096] [--probe-tokens 4096]
      [--state-bytes-per-param 24] [--cache FILE] [--json FILE]

A whole step at 512 x 4096 is about a day of these cores, so each phase is measured where its
cost is decided, and the step is summed from those measurements:
  rollout  decode steps are timed (roofline_bench --phases decode: the K - 1 steps of a warm
           generate(K), GenerateStats::decode_seconds) at S sequences and at the KV positions the rollout passes
           through, S being the slots rpg train decodes with: min(B, rollout.max_num_seqs,
           kv_cache_memory_fraction x MemAvailable / (prompt + L) / K/V bytes per token), B
           sequences going through in ceil(B / S) waves. The step time at position p is
           fitted as a + b p per S (each step reads the weights once and every sequence's K/V
           up to p; the table of probes shows how well that holds) and summed over the
           rollout's positions and waves, plus one prefill per prompt (n sequences share it).
  logprob  one no-grad pass, update one pass with autograd and backward (gradient checkpointing
  update   on), each timed on one micro-batch of --micro-tokens tokens (at least one sequence)
           at response length L and scaled by B / rows: rpg train runs B sequences as micro-
           batches of that shape (gradient accumulation), so these phases are linear in B by
           construction; what grows with L is measured.
step = rollout + 2 x logprob + update, as in scaling.py. GFLOP/s are model FLOPs (flops.py).
"""
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_run import run_bench, sweep_arguments  # noqa: E402
from flops import ModelWork  # noqa: E402

ap = sweep_arguments(lengths="256,512,1024,2048,4096", batches="8,32,128,512", base_length=256)
ap.add_argument("--n", type=int, default=8, help="responses per prompt (one prefill each n)")
ap.add_argument("--max-num-seqs", type=int, default=256, help="actor_rollout_ref.rollout.max_num_seqs")
ap.add_argument("--kv-fraction", type=float, default=0.8, help="actor_rollout_ref.rollout.kv_cache_memory_fraction")
ap.add_argument("--micro-tokens", type=int, default=4096, help="tokens of the measured log-prob / update micro-batch")
ap.add_argument("--probe-tokens", type=int, default=4096,
                help="tokens generated per decode probe: S sequences take max(16, min(64, this / S)) steps")
ap.add_argument("--state-bytes-per-param", type=float, default=24,
                help="memory rpg train holds when a rollout starts, per parameter: fp32 weights, gradients, the two "
                     "AdamW moments, the fixed reference (20), and the decode's packed copy of the weights (4)")
ap.add_argument("--cache", help="measurements kept in (and reused from) this JSON file: an interrupted run resumes")
ap.add_argument("--json", help="also write every measurement to this file")
args = ap.parse_args()
MW = ModelWork(args.model, 4)
P0 = args.prompt_len
KV_PER_TOKEN = 2 * MW.L * MW.Hkv * MW.D * 4  # fp32 K and V of every layer
WEIGHT_BYTES = (MW.L * MW.layer_weights + MW.C * MW.V) * 4


def mem_available():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    sys.exit("scaling_long: /proc/meminfo has no MemAvailable")


AVAIL = mem_available()
PARAMS = MW.L * MW.layer_weights + MW.C * MW.V + (0 if MW.config.get("tie_word_embeddings") else MW.C * MW.V)
# What MemAvailable would say when rpg train starts a rollout: the training state is resident.
ROLLOUT_AVAIL = AVAIL - args.state_bytes_per_param * PARAMS
if ROLLOUT_AVAIL <= 0:
    sys.exit(f"scaling_long: the training state ({args.state_bytes_per_param * PARAMS / 2**30:.1f} GiB) does not fit "
             f"the {AVAIL / 2**30:.1f} GiB available")
cache = json.load(open(args.cache)) if args.cache and os.path.exists(args.cache) else {}


def cached(key, measure):
    """measure() once per key, kept in --cache (written after every new measurement)."""
    if key not in cache:
        cache[key] = measure()
        if args.cache:
            with open(args.cache + ".tmp", "w") as f:
                json.dump(cache, f, indent=1)
            os.replace(args.cache + ".tmp", args.cache)
    return cache[key]


BASE = [args.bench, "--model", args.model, "--threads", str(args.threads), "--repeats", "1"]


def slots(batch, length):
    budget = args.kv_fraction * ROLLOUT_AVAIL // ((P0 + length) * KV_PER_TOKEN)
    return int(max(1, min(batch, args.max_num_seqs, budget)))


probes = {}  # (S, position) -> {"step_s", "prefill_s", "rss_mib"}


def probe(S, P):
    K = probe_steps(S)

    def measure():
        # Warm (one untimed generate of each length first): a cold call's page faults and
        # first-touch would be a large share of a few steps.
        lines, rss = run_bench(BASE + ["--warmup", "1", "--phases", "decode", "--decode-seqs", str(S),
                                       "--prompt-len", str(P), "--new-tokens", str(K)])
        m = lines[0]
        print(f"  decode S={S} P={P}: {1e3 * m['step_seconds']:.1f} ms/step", file=sys.stderr, flush=True)
        # Steps 1..K-1 attend over P+1..P+K-1 keys: their mean position is P + K/2. step_seconds
        # times those steps alone (GenerateStats::decode_seconds).
        return {"step_s": m["step_seconds"], "prefill_s": m["prefill_seconds"], "rss_mib": rss, "position": P + K / 2}

    probes[(S, P)] = cached(f"decode S={S} P={P} K={K}", measure)
    return probes[(S, P)]


def step_fit(S, positions):
    """Least squares a + b p over the probes of S at these prompt lengths."""
    pts = [(probe(S, P)["position"], probe(S, P)["step_s"]) for P in positions]
    n = len(pts)
    if n == 1:  # a response no longer than one probe: its steps' mean
        return pts[0][1], 0.0
    mp = sum(p for p, _ in pts) / n
    mt = sum(t for _, t in pts) / n
    b = sum((p - mp) * (t - mt) for p, t in pts) / sum((p - mp) ** 2 for p, _ in pts)
    return mt - b * mp, b


def probe_steps(S):
    return max(16, min(64, args.probe_tokens // S))


def probe_positions(length, S, extra=()):
    """Prompt lengths whose probes cover the start and the end of a response of `length`."""
    return sorted({P0, max(P0, P0 + length - probe_steps(S)), *extra})


passes = {}  # length -> {"rows", "logprob_s", "update_s", "rss_mib"}


def pass_cost(length):
    rows = max(1, args.micro_tokens // (P0 + length))

    def measure():
        # Cold, as a training step meets its shapes (scaling.py does the same).
        lines, rss = run_bench(BASE + ["--warmup", "0", "--phases", "logprob,update", "--rows", str(rows),
                                       "--response", str(length), "--prompt-len", str(P0), "--checkpointing", "1"])
        ms = {m["phase"]: m for m in lines}
        print(f"  passes L={length} rows={rows}: logprob {ms['logprob']['seconds']:.1f} s, "
              f"update {ms['update']['seconds']:.1f} s", file=sys.stderr, flush=True)
        return {"rows": rows, "logprob_s": ms["logprob"]["seconds"], "update_s": ms["update"]["seconds"], "rss_mib": rss}

    passes[length] = cached(f"passes L={length} rows={rows}", measure)
    return passes[length]


def point(batch, length, fit_positions=None):
    S = slots(batch, length)
    waves = [S] * (batch // S) + ([batch % S] if batch % S else [])
    prefill_s = probe(min(args.n, S), P0)["prefill_s"] * math.ceil(batch / args.n)
    positions = [P0 + k for k in range(1, length)]  # decode step k reads P0 + k keys
    decode_s = 0.0
    for w in waves:
        a, b = step_fit(w, fit_positions or probe_positions(length, w))
        decode_s += sum(a + b * p for p in positions)
    rollout_flops = MW.work({"phase": "decode", "seqs": batch, "prompt_len": P0, "new_tokens": length})[0] + \
        math.ceil(batch / args.n) * MW.forward_flops(P0, MW.causal_keys(P0), 1)
    pc = pass_cost(length)
    one = {"rows": 1, "response": length, "prompt_len": P0}
    out = {"batch": batch, "length": length, "slots": S, "waves": len(waves),
           "kv_gb": S * (P0 + length) * KV_PER_TOKEN / 1e9,
           "rollout": (prefill_s + decode_s, rollout_flops),
           "logprob": (pc["logprob_s"] / pc["rows"] * batch, MW.work({**one, "phase": "logprob"})[0] * batch),
           "update": (pc["update_s"] / pc["rows"] * batch, MW.work({**one, "phase": "update"})[0] * batch),
           "pass_rows": pc["rows"], "pass_rss_mib": pc["rss_mib"]}
    out["step"] = (out["rollout"][0] + 2 * out["logprob"][0] + out["update"][0],
                   out["rollout"][1] + 2 * out["logprob"][1] + out["update"][1])
    return out


def secs(v):
    return f"{v:.1f}" if v < 100 else f"{v:.0f}"


def table(title, points):
    print(f"\n{title}\n")
    print("| B | L | tokens | slots x waves (KV GB) | rollout s (GFLOP/s) | logprob s (GFLOP/s) | update s (GFLOP/s) "
          "| step s | x work | x time | pass RSS MiB (rows) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    base = points[0]
    for p in points:
        cells = [f"{secs(p[k][0])} ({p[k][1] / p[k][0] / 1e9:.0f})" for k in ("rollout", "logprob", "update")]
        print(f"| {p['batch']} | {p['length']} | {p['batch'] * (P0 + p['length'])} | {p['slots']} x {p['waves']} "
              f"({p['kv_gb']:.1f}) | " + " | ".join(cells) + f" | {secs(p['step'][0])} | "
              f"{p['step'][1] / base['step'][1]:.2f} | {p['step'][0] / base['step'][0]:.2f} | "
              f"{'-' if p['pass_rss_mib'] is None else format(p['pass_rss_mib'], '.0f')} ({p['pass_rows']}) |")


lengths = [int(x) for x in args.lengths.split(",")]
batches = [int(x) for x in args.batches.split(",")]
print(f"model {os.path.basename(os.path.normpath(args.model))}: {MW.L} layers, hidden {MW.C}, heads {MW.H}/{MW.Hkv}, "
      f"intermediate {MW.I}, vocab {MW.V}; prompt {P0}, n {args.n}, {args.threads} threads, fp32, gradient "
      f"checkpointing on; MemAvailable {AVAIL / 2**30:.1f} GiB, at a rollout's start {ROLLOUT_AVAIL / 2**30:.1f} GiB "
      f"(less {args.state_bytes_per_param:g} B x {PARAMS / 1e6:.0f} M parameters), KV {KV_PER_TOKEN} B/token, "
      f"slots = min(B, {args.max_num_seqs}, {args.kv_fraction} x that / KV per sequence)")
# The length sweep's decode steps: one line fitted through probes at the start, a quarter, half
# and the end of the longest response (its fit error says whether a line is what they follow).
top = max(lengths)
all_positions = probe_positions(top, args.base_batch, (P0 + top // 4, P0 + top // 2))
by_length = [point(args.base_batch, n, all_positions) for n in lengths]
by_batch = [point(b, args.base_length) for b in batches]
corner = point(max(batches), max(lengths))

print("\nDecode steps measured (ms per step at a mean KV position; GB/s = the weights plus every sequence's "
      "K/V read once per step; fit = the a + b p line of that S)\n")
print("| S | position | ms/step | GB/s | fit ms | fit error |")
print("|---|---|---|---|---|---|")
fits = {}
for (S, P), pr in sorted(probes.items()):
    if S not in fits:
        fits[S] = step_fit(S, sorted(P2 for S2, P2 in probes if S2 == S)) if sum(1 for S2, _ in probes if S2 == S) > 1 \
            else None
    gbs = (WEIGHT_BYTES + S * pr["position"] * KV_PER_TOKEN) / pr["step_s"] / 1e9
    fit = fits[S]
    fit_ms = f"{1e3 * (fit[0] + fit[1] * pr['position']):.1f}" if fit else "-"
    err = f"{100 * ((fit[0] + fit[1] * pr['position']) / pr['step_s'] - 1):+.1f}%" if fit else "-"
    print(f"| {S} | {pr['position']:.0f} | {1e3 * pr['step_s']:.1f} | {gbs:.1f} | {fit_ms} | {err} |")
table(f"Response length (B = {args.base_batch})", by_length)
table(f"Batch (L = {args.base_length})", by_batch)
table("The corner", [by_length[0], corner])
if args.json:
    with open(args.json, "w") as f:
        json.dump({"probes": {f"{S},{P}": v for (S, P), v in probes.items()}, "passes": passes,
                   "by_length": by_length, "by_batch": by_batch, "corner": corner}, f, indent=1)
