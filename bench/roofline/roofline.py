"""Roofline: rpg's phases as a fraction of this machine's own peak, next to transformers on
the same model, shapes and thread count, in one run.

  .venv/bin/python bench/roofline/roofline.py MODEL_DIR [--threads 2] [--bench build/bench/roofline/roofline_bench]
      [--decode-seqs 1,8,64] [--new-tokens 64] [--prompt-len 128] [--prefill-seqs 8] [--rows 16] [--response 128] [--group 1]
      [--repeats 3] [--dtype float32|bfloat16] [--ops 8] [--skip-hf] [--json FILE]

1. The peak, measured here with torch (the same MKL / oneDNN that rpg links): GEMM at a
   large square shape (2048^3) and at the model's own shapes (every layer's projections and
   the lm_head, weights cold as in a decode step, at 64 rows and at 1024 rows), and memory
   bandwidth (a read of 1 GiB and a copy).
2. rpg (roofline_bench, a child process) and transformers (this process) on the same work:
     decode   S sequences of one --prompt-len prompt, --new-tokens each (EOS ignored): the
              seconds of generate(T) minus generate(1), i.e. T-1 decode steps, prefill excluded
              (transformers starts from a copy of the S prompts' cache, prefilled once)
     prefill  --prefill-seqs prompts of --prompt-len tokens, last-token logits
     logprob  --rows rows of prompt + response without autograd (old / reference log-probs),
              log-probs of the response tokens (transformers: logits_to_keep, as TRL does)
     update   the same with autograd, entropy and backward (the actor update's pass)
     optimizer  AdamW's step over every parameter (transformers side: torch.optim.AdamW,
              single-tensor as verl's on the CPU; fused, TRL's default, printed too)
3. FLOPs per phase from config.json, one formula for both sides (model FLOPs: 2 per weight
   per token through every projection, the lm_head only where logits are used, attention's
   QK^T and PV over the keys each query sees; backward = 2 x forward); bytes for decode
   (weights once per step + each sequence's K/V).

--group G makes the logprob/update rows share prompts in groups of G (GRPO's layout): rpg
computes a shared prompt once (split_prompt), so its "FLOP/s" counts work it skipped; the
default 1 measures kernels, not that saving. The full RL step is bench/trl_step
(trl_step_bench.py --model MODEL_DIR), which converts its step times with the same model.
"""
import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))

ap = argparse.ArgumentParser()
ap.add_argument("model")
ap.add_argument("--bench", default=os.path.join(REPO, "build", "bench", "roofline", "roofline_bench"))
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--phases", default="decode,prefill,logprob,update")
ap.add_argument("--decode-seqs", default="1,8,64")
ap.add_argument("--new-tokens", type=int, default=64)
ap.add_argument("--prompt-len", type=int, default=128)
ap.add_argument("--prefill-seqs", type=int, default=8)
ap.add_argument("--rows", type=int, default=16)
ap.add_argument("--response", type=int, default=128)
ap.add_argument("--group", type=int, default=1)
ap.add_argument("--repeats", type=int, default=3)
ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
ap.add_argument("--ops", type=int, default=0, help="print rpg's K ops with the most self time per phase")
ap.add_argument("--skip-hf", action="store_true", help="rpg and the peak only")
ap.add_argument("--json", help="also write every measurement to this file")
args = ap.parse_args()
torch.set_num_threads(args.threads)
DT = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
phases = args.phases.split(",")


def median_seconds(f, repeats=args.repeats):
    f()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


# ---- the model's work, from config.json (flops.py) -----------------------------------------
sys.path.insert(0, HERE)
from flops import ModelWork  # noqa: E402

MW = ModelWork(args.model, torch.tensor([], dtype=DT).element_size())
C, L, V, H, Hkv, D, I = MW.C, MW.L, MW.V, MW.H, MW.Hkv, MW.D, MW.I
LAYER_SHAPES, LAYER_WEIGHTS = MW.layer_shapes, MW.layer_weights
work = MW.work


# ---- the machine's peak -----------------------------------------------------------------
def gemm_gflops(m, k, n, dtype, reps=5):
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    return 2 * m * k * n / median_seconds(lambda: a @ b, reps) / 1e9


def model_gemm_gflops(rows, dtype):
    """Every layer's projections and the lm_head at `rows` rows, distinct weights per layer
    (cold in cache, as in a decode step)."""
    ws = [[torch.randn(o, i, dtype=dtype) for o, i in LAYER_SHAPES] for _ in range(L)] + [[torch.randn(V, C, dtype=dtype)]]
    xs = {i: torch.randn(rows, i, dtype=dtype) for i in {C, H * D, I}}

    def run():
        for layer in ws:
            for w in layer:
                torch.nn.functional.linear(xs[w.shape[1]], w)
    flops = 2 * rows * (L * LAYER_WEIGHTS + V * C)
    return flops / median_seconds(run, 3) / 1e9


def bandwidth_gbs():
    a = torch.ones(256 << 20)  # 1 GiB fp32
    b = torch.empty_like(a)
    read = a.numel() * 4 / median_seconds(lambda: a.sum(), 3) / 1e9
    copy = 2 * a.numel() * 4 / median_seconds(lambda: b.copy_(a), 3) / 1e9
    return read, copy


def cpu_flags():
    try:
        flags = next(l for l in open("/proc/cpuinfo") if l.startswith("flags")).split()
        model = next(l for l in open("/proc/cpuinfo") if l.startswith("model name")).split(":", 1)[1].strip()
    except (OSError, StopIteration):
        return "?", []
    return model, sorted(f for f in flags if f.startswith(("avx", "amx", "fma")))


cpu, flags = cpu_flags()
peak_square = gemm_gflops(2048, 2048, 2048, DT)
peak_model_64 = model_gemm_gflops(64, DT)
peak_model_1k = model_gemm_gflops(1024, DT)
bw_read, bw_copy = bandwidth_gbs()
print(f"{cpu}; {os.cpu_count()} CPUs, {args.threads} threads; {' '.join(flags)}")
print(f"model {os.path.basename(os.path.normpath(args.model))}: {L} layers, hidden {C}, heads {H}/{Hkv}, head_dim {D}, "
      f"intermediate {I}, vocab {V}, {args.dtype}")
print(f"peak: GEMM 2048^3 {peak_square:.1f} GFLOP/s; the model's GEMMs (cold weights) at 64 rows {peak_model_64:.1f}, "
      f"at 1024 rows {peak_model_1k:.1f}; memory read {bw_read:.1f} GB/s, copy {bw_copy:.1f} GB/s")
print("% of peak below: of the 2048^3 GEMM (compute) and, for decode, of the read bandwidth (bytes)")

# ---- rpg ------------------------------------------------------------------------------------
argv = [args.bench, "--model", args.model, "--threads", str(args.threads), "--phases", args.phases,
        "--decode-seqs", args.decode_seqs, "--new-tokens", str(args.new_tokens), "--prompt-len", str(args.prompt_len),
        "--prefill-seqs", str(args.prefill_seqs), "--rows", str(args.rows), "--response", str(args.response), "--group", str(args.group),
        "--repeats", str(args.repeats), "--dtype", args.dtype, "--ops", str(args.ops)]
r = subprocess.run(argv, capture_output=True, text=True)
if r.returncode:
    sys.exit(f"roofline: {args.bench} exited {r.returncode}: {r.stderr[-2000:]}")
rpg = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]


def key(m):
    return (m["phase"], m.get("seqs"))


# ---- transformers ---------------------------------------------------------------------------
hf = {}
if not args.skip_hf:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=DT, attn_implementation="sdpa")
    model.eval()
    torch.manual_seed(0)
    prompts = torch.randint(1, V, (max(args.prefill_seqs, args.rows), args.prompt_len))
    for m in rpg:
        P = m["prompt_len"]
        if m["phase"] == "decode":
            S, T = m["seqs"], m["new_tokens"]
            ids = prompts[:1].expand(S, P).contiguous()
            # The S copies of the prompt prefilled once, outside the timing: each generate() gets
            # a copy of that cache and computes only the last prompt token, then decodes. Without
            # it the S x P prefill inside both generate(T) and generate(1) (rpg prefills a shared
            # prompt once) would make their difference the small gap of two large noisy numbers.
            with torch.no_grad():
                prefilled = model(ids[:, :-1], use_cache=True).past_key_values

            def gen(t, ids=ids, prefilled=prefilled):
                with torch.no_grad():
                    model.generate(ids, attention_mask=torch.ones_like(ids), past_key_values=copy.deepcopy(prefilled),
                                   do_sample=True, top_k=0, top_p=1.0, temperature=1.0, max_new_tokens=t,
                                   min_new_tokens=t, pad_token_id=MW.config.get("eos_token_id"))
            full, first = median_seconds(lambda: gen(T)), median_seconds(lambda: gen(1))
            hf[key(m)] = full - first
        elif m["phase"] == "prefill":
            ids = prompts[: m["seqs"]]

            def prefill(ids=ids):
                with torch.no_grad():
                    model(ids, use_cache=True, logits_to_keep=1)
            hf[key(m)] = median_seconds(prefill)
        elif m["phase"] == "optimizer":
            # torch.optim.AdamW as the fork's verl builds it (single-tensor on the CPU: the same
            # ATen calls, and numbers, as rpg's step) and fused, as TRL / HF Trainer's default.
            for p in model.parameters():
                p.grad = torch.randn_like(p)
            for fused in (False, True):
                opt = torch.optim.AdamW(model.parameters(), lr=1e-6, weight_decay=0.01, foreach=False, fused=fused)
                hf[("optimizer_fused" if fused else "optimizer", None)] = median_seconds(opt.step)
            model.zero_grad(set_to_none=True)
            print(f"torch AdamW fused=True (TRL's default): {hf[('optimizer_fused', None)]:.3f} s, "
                  f"rpg {m['seconds']:.3f} s")
        else:
            B, R = m["rows"], m["response"]
            g = torch.Generator().manual_seed(1)
            ids = torch.cat([prompts[(torch.arange(B) // args.group) % prompts.shape[0]],
                             torch.randint(1, V, (B, R), generator=g)], 1)
            adv = torch.randn(B, 1)

            def pass_(update, ids=ids, adv=adv, R=R):
                with torch.set_grad_enabled(update):
                    logits = model(ids, logits_to_keep=R + 1).logits[:, :-1].float()
                    logp = torch.log_softmax(logits, -1)
                    lp = logp.gather(-1, ids[:, -R:].unsqueeze(-1)).squeeze(-1)
                    if update:
                        entropy = -(logp.exp() * logp).sum(-1)
                        loss = (-adv * (lp - lp.detach()).exp()).mean() - 1e-3 * entropy.mean()
                        loss.backward()
                        model.zero_grad(set_to_none=True)
            hf[key(m)] = median_seconds(lambda: pass_(m["phase"] == "update"))

# ---- the table ------------------------------------------------------------------------------
rows = []
print(f"\n{'phase':16s} {'work':>10s} | {'rpg s':>8s} {'GFLOP/s':>8s} {'%peak':>6s} {'GB/s':>6s} {'%bw':>5s} | "
      f"{'HF s':>8s} {'GFLOP/s':>8s} {'%peak':>6s} | {'HF/rpg':>6s}")
for m in rpg:
    flops, nbytes = work(m)
    name = m["phase"] + (f" x{m['seqs']}" if m["phase"] == "decode" else "")
    s = m["seconds"]
    g = flops / s / 1e9
    row = {"phase": name, "flops": flops, "bytes": nbytes, "rpg_seconds": s, "rpg_gflops": g,
           "rpg_pct_peak": 100 * g / peak_square}
    line = f"{name:16s} {flops / 1e9:8.1f}GF | {s:8.3f} {g:8.1f} {100 * g / peak_square:6.1f}"
    if nbytes:
        row["rpg_gbs"] = nbytes / s / 1e9
        line += f" {nbytes / s / 1e9:6.1f} {100 * nbytes / s / 1e9 / bw_read:5.1f}"
    else:
        line += f" {'':6s} {'':5s}"
    if key(m) in hf:
        h = hf[key(m)]
        hg = flops / h / 1e9
        row.update(hf_seconds=h, hf_gflops=hg, hf_pct_peak=100 * hg / peak_square, ratio=h / s)
        line += f" | {h:8.3f} {hg:8.1f} {100 * hg / peak_square:6.1f} | {h / s:6.2f}"
    print(line)
    rows.append(row)
    for op in m.get("ops", []):
        print(f"{'':18s}{op[0][:48]:48s} {op[1]:9.1f} ms {op[2]:7d} calls")

if args.json:
    with open(args.json, "w") as f:
        json.dump({"cpu": cpu, "flags": flags, "threads": args.threads, "dtype": args.dtype, "model": args.model,
                   "peak": {"gemm_2048": peak_square, "model_gemm_64": peak_model_64, "model_gemm_1024": peak_model_1k,
                            "read_gbs": bw_read, "copy_gbs": bw_copy},
                   "date": time.strftime("%Y-%m-%d"), "phases": rows}, f, indent=1)
