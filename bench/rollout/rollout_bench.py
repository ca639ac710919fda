"""Rollout throughput: rpg's engine vs transformers generate(), same model, prompts,
sampling settings and stop tokens, in one run. Prints tokens/s of each, the ratio, and
peak memory (VmHWM).

  .venv/bin/python bench/rollout/rollout_bench.py [--bench build/bench/rollout/rollout_bench]
      [--n 8] [--prompts 8] [--max-new-tokens 256] [--threads 2] [--dtype float32|bfloat16] [--model DIR]
      [--temperature 1.0] [--top-p 1.0] [--top-k -1]

The model is a random Qwen2 (hidden 512, 8 layers, vocab 16384) built here; 1/64 of the
vocabulary are stop tokens, so response lengths are mixed (geometric, mean ~64, capped at
--max-new-tokens), the case where continuous batching matters: transformers keeps every
sequence of a batch until the longest finishes.
"""
import argparse
import json
import os
import resource
import subprocess
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

ap = argparse.ArgumentParser()
ap.add_argument("--bench", default=os.path.join(os.path.dirname(__file__), "..", "..", "build", "bench", "rollout",
                                                "rollout_bench"))
ap.add_argument("--n", type=int, default=8)
ap.add_argument("--prompts", type=int, default=8)
ap.add_argument("--max-new-tokens", type=int, default=256)
ap.add_argument("--threads", type=int, default=2)
ap.add_argument("--temperature", type=float, default=1.0)
ap.add_argument("--top-p", type=float, default=1.0, help="nucleus mass, both sides (1.0: off)")
ap.add_argument("--top-k", type=int, default=-1, help="top-k, both sides (-1: off)")
ap.add_argument("--model", help="a real checkpoint (e.g. SmolLM2-135M-Instruct) with chat-templated word problems "
                "instead of the random Qwen2; stop tokens = its EOS")
ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"],
                help="weights (and KV cache) of both sides; the checkpoint is fp32, cast at load")
args = ap.parse_args()
torch.set_num_threads(args.threads)

VOCAB = 16384
def real_model_inputs(d):
    """--model: the checkpoint as it is, its chat template over short arithmetic word problems,
    its EOS ids as the stop tokens: response lengths are the model's own."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="sdpa").eval()
    g = torch.Generator().manual_seed(1)
    prompts = []
    for i in range(args.prompts):
        a, b = (int(x) for x in torch.randint(2, 99, (2,), generator=g))
        text = tok.apply_chat_template([{"role": "user", "content": f"Tom has {a} apples and buys {b} more. How many "
                                         "apples does he have? Think step by step, then give the answer."}],
                                       tokenize=False, add_generation_prompt=True)
        prompts.append(tok(text, add_special_tokens=False).input_ids)
    eos = model.generation_config.eos_token_id
    stop = sorted({*(eos if isinstance(eos, list) else [eos]), tok.eos_token_id})
    return model, args.model, prompts, stop


with tempfile.TemporaryDirectory() as d:
    if args.model:
        model, model_dir, prompts, stop = real_model_inputs(d)
    else:
        model_dir = d
        torch.manual_seed(0)
        cfg = Qwen2Config(vocab_size=VOCAB, hidden_size=512, intermediate_size=1408, num_hidden_layers=8,
                          num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=2048,
                          tie_word_embeddings=True)
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa").eval()
        model.save_pretrained(d)
        g = torch.Generator().manual_seed(1)
        prompts = [torch.randint(0, VOCAB, (int(torch.randint(16, 65, (1,), generator=g)),), generator=g).tolist()
                   for _ in range(args.prompts)]
        stop = torch.randperm(VOCAB, generator=g)[:VOCAB // 64].tolist()
    json.dump(prompts, open(os.path.join(d, "prompts.json"), "w"))

    # rpg (separate process: its own peak memory)
    out = subprocess.run([args.bench, "--model", model_dir, "--prompts", os.path.join(d, "prompts.json"), "--n", str(args.n),
                          "--max-new-tokens", str(args.max_new_tokens), "--stop", ",".join(map(str, stop)),
                          "--threads", str(args.threads), "--dtype", args.dtype, "--temperature", str(args.temperature),
                          "--top-p", str(args.top_p), "--top-k", str(args.top_k)], check=True, capture_output=True,
                         text=True)
    ours = json.loads(out.stdout)

    # transformers: left-padded batch, n return sequences each, sampled
    model = model.to(getattr(torch, args.dtype))
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    t0 = time.perf_counter()
    with torch.no_grad():
        gen = model.generate(ids, attention_mask=mask, do_sample=True, temperature=args.temperature, top_p=args.top_p,
                             top_k=max(args.top_k, 0),
                             num_return_sequences=args.n, max_new_tokens=args.max_new_tokens, eos_token_id=stop,
                             pad_token_id=stop[0])
    hf_seconds = time.perf_counter() - t0
    stop_set = set(stop)
    hf_tokens = 0
    for row in gen[:, width:].tolist():
        for t in row:
            hf_tokens += 1
            if t in stop_set:
                break
    hf_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024

print(f"responses: {args.prompts} prompts x n={args.n}, max_new_tokens={args.max_new_tokens}, threads={args.threads}, "
      f"dtype={args.dtype}, temperature={args.temperature}, top_p={args.top_p}, top_k={args.top_k}")
print(f"rpg          {ours['generated_tokens']:6d} tokens in {ours['seconds']:.2f} s = "
      f"{ours['tokens_per_second']:.1f} tokens/s, peak RSS {ours['peak_rss_mib']:.0f} MiB")
print(f"transformers {hf_tokens:6d} tokens in {hf_seconds:.2f} s = {hf_tokens / hf_seconds:.1f} tokens/s, "
      f"peak RSS {hf_peak:.0f} MiB")
print(f"ratio (rpg / transformers tokens per second): {ours['tokens_per_second'] / (hf_tokens / hf_seconds):.2f}")
