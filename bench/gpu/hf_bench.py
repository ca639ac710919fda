"""transformers' side of the GPU benchmark (scripts/gpu_check.sh; rpg's side is
bench/gpu/gpu_bench.cpp, same arguments, same JSON keys): a random Qwen2 of a
Qwen2.5-0.5B / 1.5B shape (or tiny) in bf16 or fp32 with SDPA attention, and
  --what train : forward + backward of the token log-probs (log_softmax of the logits,
                 gathered at the next tokens, mean) on [batch, seq] random tokens;
  --what decode: generate() sampling --new-tokens per prompt (min_new_tokens = max, so
                 every row generates all of them) for --batch prompts of --prompt-len.
Prints one JSON object.
"""
import argparse
import json
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config

SHAPES = {
    "0.5b": dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                 num_attention_heads=14, num_key_value_heads=2),
    "1.5b": dict(vocab_size=151936, hidden_size=1536, intermediate_size=8960, num_hidden_layers=28,
                 num_attention_heads=12, num_key_value_heads=2),
    "tiny": dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                 num_attention_heads=4, num_key_value_heads=2),
}

ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="0.5b", choices=sorted(SHAPES))
ap.add_argument("--device", default="cuda")
ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
ap.add_argument("--what", default="train", choices=["train", "decode"])
ap.add_argument("--batch", type=int, default=8)
ap.add_argument("--seq", type=int, default=1024)
ap.add_argument("--steps", type=int, default=5)
ap.add_argument("--warmup", type=int, default=1)
ap.add_argument("--chunk", type=int, default=1024)  # accepted for symmetry with gpu_bench
ap.add_argument("--prompt-len", type=int, default=128)
ap.add_argument("--new-tokens", type=int, default=256)
ap.add_argument("--seed", type=int, default=0)
a = ap.parse_args()

dev = torch.device("cuda" if a.device in ("cuda", "auto") and torch.cuda.is_available() else "cpu")
if a.device == "cuda" and dev.type != "cuda":
    raise SystemExit("hf_bench: error: --device cuda but torch sees no CUDA device")
dt = torch.bfloat16 if a.dtype == "bf16" else torch.float32
torch.manual_seed(a.seed)
cfg = Qwen2Config(**SHAPES[a.shape], rms_norm_eps=1e-6, rope_theta=1000000.0, max_position_embeddings=32768,
                  tie_word_embeddings=True)
model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa", dtype=dt).to(dev)
V = cfg.vocab_size


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


out = {"impl": "transformers", "what": a.what, "shape": a.shape, "device": str(dev), "dtype": a.dtype,
       "params": sum(p.numel() for p in model.parameters())}
if a.what == "train":
    model.train()
    ids = torch.randint(0, V, (a.batch, a.seq), device=dev)

    def step():
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids).logits[:, :-1].float()
        lp = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
        (-lp.mean()).backward()

    for _ in range(a.warmup):
        step()
    sync()
    t0 = time.perf_counter()
    for _ in range(a.steps):
        step()
    sync()
    s = (time.perf_counter() - t0) / a.steps
    out.update(batch=a.batch, seq=a.seq, steps=a.steps, seconds_per_step=s, tokens_per_second=a.batch * a.seq / s)
else:
    model.eval()
    model.generation_config.eos_token_id = None
    prompts = torch.randint(0, V, (a.batch, a.prompt_len), device=dev)
    kw = dict(do_sample=True, temperature=1.0, top_p=1.0, top_k=0, pad_token_id=0)
    with torch.no_grad():
        model.generate(prompts[: min(a.batch, 4)], max_new_tokens=4, min_new_tokens=4, **kw)  # warm-up
        sync()
        t0 = time.perf_counter()
        gen = model.generate(prompts, max_new_tokens=a.new_tokens, min_new_tokens=a.new_tokens, **kw)
        sync()
        s = time.perf_counter() - t0
    n = int((gen.shape[1] - a.prompt_len) * a.batch)
    out.update(batch=a.batch, prompt_len=a.prompt_len, new_tokens=a.new_tokens, seconds=s, generated_tokens=n,
               tokens_per_second=n / s)
if dev.type == "cuda":
    out["max_memory_allocated_gb"] = torch.cuda.max_memory_allocated() / 2**30
print(json.dumps(out), flush=True)
