"""Oracle: the sampling distribution after Hugging Face's logits warpers (temperature,
top-k, top-p, in generate()'s order). Reads logits [N, V] from IN.safetensors and a JSON list
of {temperature, top_k, top_p}; writes "probs.<j>" [N, V] (float64) to OUT.safetensors."""
import json
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers.generation.logits_process import (LogitsProcessorList, TemperatureLogitsWarper,
                                                    TopKLogitsWarper, TopPLogitsWarper)

logits = load_file(sys.argv[1])["logits"].to(torch.float64)
cases = json.loads(open(sys.argv[2]).read())
out = {}
for j, c in enumerate(cases):
    warpers = LogitsProcessorList([TemperatureLogitsWarper(c["temperature"])])
    if c["top_k"] > 0:
        warpers.append(TopKLogitsWarper(top_k=c["top_k"]))
    if c["top_p"] < 1.0:
        warpers.append(TopPLogitsWarper(top_p=c["top_p"]))
    warped = warpers(torch.zeros(logits.shape[0], 1, dtype=torch.long), logits.clone())
    out[f"probs.{j}"] = torch.softmax(warped, dim=-1)
save_file(out, sys.argv[3])
