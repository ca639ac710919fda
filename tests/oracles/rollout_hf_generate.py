"""Oracle for the rollout engine: tiny random models (built by model_hf.make) and
transformers' greedy generate() on prompts of different lengths.

usage: rollout_hf_generate.py OUT_DIR  -> OUT_DIR/<name>/ model dirs and OUT_DIR/generate.json:
  {name: {"prompts": [[ids]], "greedy": [[ids]], "eos": id, "greedy_eos": [[ids]]}}
"greedy" runs with no stop token; "greedy_eos" stops at `eos`, a token the first run
produced, so that some responses end early (the stop token is part of the output).
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM

from model_hf import make

NAMES = ["qwen2_fp32", "qwen3_fp32", "llama3_fp32"]
MAX_NEW = 10

out_dir = sys.argv[1]
make(out_dir, NAMES)
g = torch.Generator().manual_seed(7)
prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 1, 9, 3, 7)]
result = {}
for name in NAMES:
    model = AutoModelForCausalLM.from_pretrained(f"{out_dir}/{name}", dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()

    def greedy(eos):
        outs = []
        for p in prompts:
            ids = torch.tensor([p])
            with torch.no_grad():
                o = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW,
                                   min_new_tokens=0, eos_token_id=eos, pad_token_id=0)
            outs.append(o[0, len(p):].tolist())
        return outs

    plain = greedy(None)
    eos = plain[0][3]  # appears in the first response, so at least that one stops early
    result[name] = {"prompts": prompts, "greedy": plain, "eos": eos, "greedy_eos": greedy(eos)}
json.dump(result, open(f"{out_dir}/generate.json", "w"))
