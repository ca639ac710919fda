"""One attention layer of the training passes as torch's CPU SDPA runs it in the two forms
rpg chooses between (docs/benchmarks.md, "the training passes' attention without a mask"):
R scoring queries over P prompt keys then their own R keys,
  masked: the query heads of each KV head folded into the query length, a boolean mask
          (what rpg passes for a padded batch unless the mask-free form pays),
  causal: P zero queries in front, is_causal, enable_gqa (AttnInputs::key_start).
Prints the best of --repeats forward and backward seconds of each, and masked / causal.

  .venv/bin/python bench/roofline/sdpa_mask_probe.py [--shapes 64,1024;64,4096] [--rows 1]
      [--heads 14 --kv-heads 2 --head-dim 64] [--threads 2]
"""
import argparse
import time

import torch
import torch.nn.functional as F

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", default="64,1024;64,2048;64,4096", help="P,R pairs separated by ';'")
ap.add_argument("--rows", type=int, default=1)
ap.add_argument("--heads", type=int, default=14)
ap.add_argument("--kv-heads", type=int, default=2)
ap.add_argument("--head-dim", type=int, default=64)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--repeats", type=int, default=3)
args = ap.parse_args()
torch.set_num_threads(args.threads)
B, H, Hkv, D = args.rows, args.heads, args.kv_heads, args.head_dim
rep = H // Hkv

print("P\tR\tmasked_fwd_s\tmasked_bwd_s\tcausal_fwd_s\tcausal_bwd_s\tfwd_ratio\tbwd_ratio")
for shape in args.shapes.split(";"):
    P, R = (int(x) for x in shape.split(","))
    S = P + R
    q = torch.randn(B, H, R, D, requires_grad=True)
    k = torch.randn(B, Hkv, S, D, requires_grad=True)
    v = torch.randn(B, Hkv, S, D, requires_grad=True)
    own = torch.ones(R, R, dtype=torch.bool).tril()
    mask = torch.cat([torch.ones(R, P, dtype=torch.bool), own], 1)
    mask = mask.view(1, 1, 1, R, S).expand(B, 1, rep, R, S).reshape(B, 1, rep * R, S)

    def masked():
        return F.scaled_dot_product_attention(q.reshape(B, Hkv, rep * R, D), k, v, mask)

    def causal():
        padded = torch.cat([q.new_zeros(B, H, P, D), q], 2)
        return F.scaled_dot_product_attention(padded, k, v, is_causal=True, enable_gqa=True).narrow(2, P, R)

    times = []
    for f in (masked, causal):
        fwd = bwd = float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            o = f()
            t1 = time.perf_counter()
            o.sum().backward()
            t2 = time.perf_counter()
            fwd, bwd = min(fwd, t1 - t0), min(bwd, t2 - t1)
        times += [fwd, bwd]
    print(f"{P}\t{R}\t{times[0]:.4f}\t{times[1]:.4f}\t{times[2]:.4f}\t{times[3]:.4f}\t"
          f"{times[0] / times[2]:.2f}\t{times[1] / times[3]:.2f}", flush=True)
