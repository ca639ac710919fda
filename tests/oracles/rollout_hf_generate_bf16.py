"""Oracle for bf16 rollouts: tiny random fp32 checkpoints (model_hf.make) loaded by
transformers in bf16 (the master weights cast), greedy generate(), and for every generated
token the gap between its logit and the runner-up's.

usage: rollout_hf_generate_bf16.py OUT_DIR -> OUT_DIR/<name>/ model dirs and OUT_DIR/generate_bf16.json:
  {name: {"prompts": [[ids]], "greedy": [[ids]], "trusted": [n]}}
"trusted": how many leading tokens of each response were chosen with a top-2 gap above
GAP_ULPS bf16 units in the last place of the top logit: where two correct bf16
implementations must pick the same token (a smaller gap may flip under a different but
equally valid summation order)."""
import json
import math
import sys

import torch
from transformers import AutoModelForCausalLM

from model_hf import make

NAMES = ["qwen2_fp32", "qwen3_fp32", "llama3_fp32"]
MAX_NEW = 16
GAP_ULPS = 8

out_dir = sys.argv[1]
make(out_dir, NAMES)
g = torch.Generator().manual_seed(11)
prompts = [torch.randint(3, 500, (n,), generator=g).tolist() for n in (5, 1, 9, 3, 7, 12, 2, 6)]


def ulp_bf16(x):
    # spacing of bf16 numbers at |x|: 2^(exponent - 7)
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - 7)


result = {}
for name in NAMES:
    model = AutoModelForCausalLM.from_pretrained(f"{out_dir}/{name}", dtype=torch.bfloat16,
                                                 attn_implementation="sdpa").eval()
    greedy, trusted = [], []
    for p in prompts:
        ids = torch.tensor([p])
        with torch.no_grad():
            o = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW,
                               min_new_tokens=MAX_NEW, eos_token_id=None, pad_token_id=0,
                               output_logits=True, return_dict_in_generate=True)
        greedy.append(o.sequences[0, len(p):].tolist())
        n = 0
        for step_logits in o.logits:
            top = step_logits[0].float().topk(2).values.tolist()
            if top[0] - top[1] <= GAP_ULPS * ulp_bf16(top[0]):
                break
            n += 1
        trusted.append(n)
    result[name] = {"prompts": prompts, "greedy": greedy, "trusted": trusted}
json.dump(result, open(f"{out_dir}/generate_bf16.json", "w"))
