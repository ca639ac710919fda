"""HF side of bench/tokenizer: encode throughput of Hugging Face `tokenizers` on a corpus.

    hf_encode.py TOKENIZER_JSON CORPUS THREADS ROUNDS IDS_OUT
Prints one line "hf_batch_mb_s=<x> hf_batch_fast_mb_s=<y>" and writes the ids of every
line (JSON lines) so the caller can check both sides produced the same ids.
"""
import json
import os
import sys
import time

threads = sys.argv[3]
os.environ["RAYON_NUM_THREADS"] = threads  # read when the rayon pool starts
from tokenizers import Tokenizer  # noqa: E402

tok = Tokenizer.from_file(sys.argv[1])
with open(sys.argv[2], encoding="utf-8", newline="") as f:
    lines = f.read().split("\n")
nbytes = sum(len(s.encode("utf-8")) for s in lines)
rounds = int(sys.argv[4])


def measure(fn):
    fn(lines)  # warm the BPE cache, as the C++ side is warmed
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn(lines)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e6


batch = measure(lambda xs: tok.encode_batch(xs, add_special_tokens=False))
fast_fn = getattr(tok, "encode_batch_fast", None)
fast = measure(lambda xs: fast_fn(xs, add_special_tokens=False)) if fast_fn else 0.0
with open(sys.argv[5], "w") as f:
    for e in tok.encode_batch(lines, add_special_tokens=False):
        f.write(json.dumps(e.ids) + "\n")
print(f"hf_batch_mb_s={batch:.3f} hf_batch_fast_mb_s={fast:.3f}")
