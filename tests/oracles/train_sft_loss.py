"""Oracle for src/rpg/train/sft: transformers' own SFT loss and one AdamW update on
(prompt, response) pairs, each sequence scored alone (no padding), so the C++ padded,
chunked, micro-batched computation is checked against the plainest possible one.

usage: train_sft_loss.py MODEL_DIR PAIRS.jsonl OUT.safetensors
Prints {"loss", "tokens", "grad_norm", "prompt_ids", "response_ids"}: loss = token-mean
cross-entropy over every response token (the EOS appended) of all pairs; grad_norm = the
global L2 norm of its gradient. OUT gets that gradient of every parameter, by Hugging Face
name (tied lm_head once, as embed_tokens). The gradient, not an AdamW step, is compared:
Adam's first step is g / (|g| + eps), so weights whose gradient is ~eps would amplify
float32 rounding into differences of order lr.
"""
import json
import sys

import torch
from safetensors.torch import save_file
from transformers import AutoModelForCausalLM, AutoTokenizer

model_dir, pairs_file, out_file = sys.argv[1], sys.argv[2], sys.argv[3]
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, torch_dtype=torch.float32, attn_implementation="eager")
model.train()  # no dropout in Qwen2; the mode only matters for autograd bookkeeping
pairs = [json.loads(line) for line in open(pairs_file) if line.strip()]

prompt_ids, response_ids = [], []
for p in pairs:
    text = tok.apply_chat_template([{"role": "user", "content": p["prompt"]}], add_generation_prompt=True,
                                   tokenize=False)
    prompt_ids.append(tok(text, add_special_tokens=False).input_ids)
    response_ids.append(tok(p["response"], add_special_tokens=False).input_ids + [tok.eos_token_id])

tokens = sum(len(r) for r in response_ids)
total = torch.zeros((), dtype=torch.float64)
for pi, ri in zip(prompt_ids, response_ids):
    ids = torch.tensor([pi + ri])
    logits = model(input_ids=ids).logits[0].float()
    # Position t predicts token t + 1: the response tokens are predicted from len(pi) - 1 on.
    pred = logits[len(pi) - 1:len(pi) + len(ri) - 1]
    nll = torch.nn.functional.cross_entropy(pred, torch.tensor(ri), reduction="sum")
    (nll / tokens).backward()
    total += nll.detach().double()

grads = {name: p.grad.detach().contiguous() for name, p in model.named_parameters() if p.grad is not None}
grad_norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g.double()) for g in grads.values()])).item()
save_file(grads, out_file)
print(json.dumps({"loss": (total / tokens).item(), "tokens": tokens, "grad_norm": grad_norm,
                  "prompt_ids": prompt_ids, "response_ids": response_ids}))
