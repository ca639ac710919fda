"""Live transformers oracle for the model tests (tests/model/).

  model_hf.py make <out_dir> [name ...]
      Builds tiny random models with transformers (fixed seeds), saves each with
      save_pretrained into <out_dir>/<name>/ and writes <out_dir>/<name>.ref.safetensors:
      a padded batch (left-padded prompts, right-padded responses, verl layout), the
      logits transformers computes for it, and log-probs / entropies of the response
      tokens at temperature TEMPERATURE computed from those logits in fp32.
  model_hf.py logits <model_dir> <ref.safetensors> <out.safetensors> [...triples]
      Loads a model directory (e.g. one written by rpg) with transformers, fails on any
      missing or unexpected weight, and writes its logits for the ref batch.
"""
import json
import sys

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config

TEMPERATURE = 0.7
VOCAB = 500

# name -> (config class, config kwargs, saved dtype, dtype transformers computes the reference in, save kwargs)
LLAMA3_ROPE = {"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
SPECS = {
    # GQA ratio 2, untied, fp32
    "qwen2_fp32": (Qwen2Config, dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                     intermediate_size=112, num_hidden_layers=3), torch.float32, torch.float32, {}),
    # odd head count, GQA ratio 1 (plain MHA), tied embeddings, bf16
    "qwen2_tied_bf16": (Qwen2Config, dict(hidden_size=60, num_attention_heads=3, num_key_value_heads=3,
                                          intermediate_size=96, num_hidden_layers=2, tie_word_embeddings=True),
                        torch.bfloat16, torch.bfloat16, {}),
    # fp16 checkpoint, loaded by both sides into fp32
    # (and an explicit head_dim 24 != 64/4, which Qwen2 also honours)
    "qwen2_fp16file": (Qwen2Config, dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1, head_dim=24,
                                         intermediate_size=128, num_hidden_layers=2), torch.float16, torch.float32, {}),
    # head_dim 24 != 64/8, GQA ratio 4, tied, fp32
    "qwen3_fp32": (Qwen3Config, dict(hidden_size=64, num_attention_heads=8, num_key_value_heads=2, head_dim=24,
                                     intermediate_size=96, num_hidden_layers=3, tie_word_embeddings=True),
                   torch.float32, torch.float32, {}),
    # odd heads (5, ratio 5), head_dim 16 != 48/5, untied, bf16, sharded by transformers
    "qwen3_bf16_sharded": (Qwen3Config, dict(hidden_size=48, num_attention_heads=5, num_key_value_heads=1,
                                             head_dim=16, intermediate_size=80, num_hidden_layers=2),
                           torch.bfloat16, torch.bfloat16, {"max_shard_size": "40KB"}),
    # Llama 3 rope scaling, GQA ratio 4, fp32
    "llama3_fp32": (LlamaConfig, dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=1,
                                      intermediate_size=128, num_hidden_layers=2, rope_parameters=LLAMA3_ROPE),
                    torch.float32, torch.float32, {}),
    # Llama 3, bf16, tied, GQA ratio 2
    "llama3_bf16": (LlamaConfig, dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                      intermediate_size=128, num_hidden_layers=2, tie_word_embeddings=True,
                                      rope_parameters=LLAMA3_ROPE), torch.bfloat16, torch.bfloat16, {}),
    # qwen2_fp32's shape on a batch with responses of up to 1030 tokens (padded_batch(long=True))
    "qwen2_long_fp32": (Qwen2Config, dict(hidden_size=64, num_attention_heads=4, num_key_value_heads=2,
                                          intermediate_size=112, num_hidden_layers=3), torch.float32, torch.float32, {}),
}
# Specs whose batch has long responses: long enough (R >= 1024, at most R / 4 prompt tokens)
# that rpg's padded log-probs attend without a mask (detail::key_start_form_pays).
LONG = {"qwen2_long_fp32"}


def padded_batch(seed, long=False):
    """verl layout: prompts left-padded to P, responses right-padded to R. Row 0 is full."""
    g = torch.Generator().manual_seed(seed)
    if long:
        P, R = 12, 1030
        prompt_lens, response_lens = [12, 5, 1, 9], [1030, 700, 1029, 3]
    else:
        # Long enough (T = 70) that attention kernels work in several blocks.
        P, R = 40, 30
        prompt_lens, response_lens = [40, 17, 3, 26], [30, 12, 1, 21]
    B = len(prompt_lens)
    ids = torch.randint(1, VOCAB, (B, P + R), generator=g)
    mask = torch.zeros(B, P + R, dtype=torch.long)
    for b, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        mask[b, P - p:P + r] = 1
    ids = ids * mask  # pad id 0
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos, R


def reference(model, ids, mask, pos, R, compute_dtype):
    """Logits, response log-probs / entropies and, in fp32, the gradients of a weighted sum
    of them (the shape of a policy-gradient loss) with respect to every parameter."""
    train = compute_dtype == torch.float32
    model.zero_grad()
    with torch.set_grad_enabled(train):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        T = ids.shape[1]
        z = logits[:, T - R - 1:T - 1].float() / TEMPERATURE
        logp_all = torch.log_softmax(z, -1)
        targets = ids[:, T - R:]
        logp = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
        entropy = -(logp_all.exp() * logp_all).sum(-1)
        g = torch.Generator().manual_seed(7)
        resp = mask[:, T - R:].float()
        w_lp, w_ent = torch.randn(logp.shape, generator=g) * resp, torch.randn(logp.shape, generator=g) * resp
        out = {"input_ids": ids, "attention_mask": mask, "position_ids": pos,
               "logits": logits.detach().float().contiguous(), "targets": targets.contiguous(),
               "log_probs": logp.detach().contiguous(), "entropy": entropy.detach().contiguous(),
               "temperature": torch.tensor([TEMPERATURE]),
               "num_parameters": torch.tensor([model.num_parameters()], dtype=torch.int64),
               "loss_w_lp": w_lp, "loss_w_ent": w_ent}
        if train:
            ((logp * w_lp).sum() + (entropy * w_ent).sum()).backward()
            for name, p in model.named_parameters():
                out["grad." + name] = p.grad.detach().contiguous()
    return out


def make(out_dir, names):
    for i, name in enumerate(names):
        cls, kwargs, save_dtype, compute_dtype, save_kwargs = SPECS[name]
        torch.manual_seed(1000 + i)
        config = cls(vocab_size=VOCAB, rms_norm_eps=1e-5, initializer_range=0.05,
                     max_position_embeddings=2048 if name in LONG else 256, **kwargs)
        model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
        with torch.no_grad():  # norms at 1 and biases at 0 would hide loading mistakes
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.copy_(1 + 0.2 * torch.randn_like(p))
                elif pname.endswith("bias"):
                    p.copy_(0.1 * torch.randn_like(p))
        model = model.to(save_dtype)
        model.save_pretrained(f"{out_dir}/{name}", **save_kwargs)
        # The reference comes from the checkpoint as a user loads it: casting the live
        # model would also round its fp32 RoPE buffers, which from_pretrained keeps.
        model = AutoModelForCausalLM.from_pretrained(f"{out_dir}/{name}", dtype=compute_dtype,
                                                     attn_implementation="sdpa").eval()
        ids, mask, pos, R = padded_batch(2000 + i, long=name in LONG)
        save_file(reference(model, ids, mask, pos, R, compute_dtype), f"{out_dir}/{name}.ref.safetensors")


def logits(triples):
    for model_dir, ref_path, out_path in triples:
        ref = load_file(ref_path)
        with open(f"{model_dir}/config.json") as f:
            dtype = getattr(torch, json.load(f).get("dtype", "float32"))
        model, info = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype, output_loading_info=True,
                                                           attn_implementation="sdpa")
        bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
        if bad:
            sys.exit(f"{model_dir}: transformers reports {bad}")
        model.eval()
        with torch.no_grad():
            out = model(input_ids=ref["input_ids"], attention_mask=ref["attention_mask"],
                        position_ids=ref["position_ids"]).logits
        save_file({"logits": out.float().contiguous()}, out_path)


if __name__ == "__main__":
    cmd = sys.argv[1]
    if cmd == "make":
        make(sys.argv[2], sys.argv[3:] or list(SPECS))
    elif cmd == "logits":
        a = sys.argv[2:]
        if len(a) % 3:
            sys.exit("logits: expected triples <model_dir> <ref> <out>")
        logits([a[i:i + 3] for i in range(0, len(a), 3)])
    else:
        sys.exit(f"unknown command {cmd}")
