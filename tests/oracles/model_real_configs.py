"""Live transformers oracle for the published config.json fixtures (tests/model/real_configs/).

  model_real_configs.py <out_dir> <configs_dir>
      For every <name>.json in <configs_dir>:
      - <out_dir>/<name>.params.json: transformers' parameter list (name and shape, in
        named_parameters order, a tied lm_head not repeated) and num_parameters() of the
        full-size model, constructed on the meta device from the file as a user's config.json
        (AutoConfig.from_pretrained on a directory holding it), and the layer types and RoPE
        parameters transformers resolved from it.
      - <out_dir>/<name>/: the same config cut to 2 layers (and, except for the two smallest
        models, every width divided by 8; vocabulary 1000), every other key as published,
        with random fp32 weights saved by transformers; config.json is the published text
        with only those size keys changed, so both sides parse the published spelling.
      - <out_dir>/<name>.ref.safetensors: a padded verl-layout batch and transformers' fp32
        logits for it, from the saved directory loaded back with from_pretrained.
"""
import glob
import json
import os
import sys
import tempfile

import torch
from safetensors.torch import save_file
from transformers import AutoConfig, AutoModelForCausalLM

VOCAB = 1000
SHRINK = 8
KEEP_WIDTHS = {"Qwen2.5-0.5B", "Qwen3-0.6B"}  # small enough to test at their real widths


def load_config(d):
    with tempfile.TemporaryDirectory() as t:
        with open(f"{t}/config.json", "w") as f:
            json.dump(d, f)
        return AutoConfig.from_pretrained(t)


def params(d):
    cfg = load_config(d)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg)
    return {"num_parameters": model.num_parameters(),
            "parameters": [[n, list(p.shape)] for n, p in model.named_parameters()],
            "layer_types": list(getattr(cfg, "layer_types", None) or []),
            "rope_parameters": cfg.rope_parameters}


def cut(name, d):
    c = dict(d)
    c["num_hidden_layers"] = 2
    c["vocab_size"] = VOCAB
    if name not in KEEP_WIDTHS:
        for key in ("hidden_size", "intermediate_size", "head_dim"):
            if c.get(key) is not None:
                assert c[key] % SHRINK == 0, (name, key)
                c[key] //= SHRINK
    return c


def padded_batch(seed):
    g = torch.Generator().manual_seed(seed)
    P, R = 24, 16
    prompt_lens, response_lens = [24, 9, 2], [16, 7, 1]
    ids = torch.randint(1, VOCAB, (len(prompt_lens), P + R), generator=g)
    mask = torch.zeros_like(ids)
    for b, (p, r) in enumerate(zip(prompt_lens, response_lens)):
        mask[b, P - p:P + r] = 1
    ids = ids * mask
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, pos


def main(out_dir, configs_dir):
    files = sorted(glob.glob(f"{configs_dir}/*.json"))
    if not files:
        sys.exit(f"no *.json in {configs_dir}")
    for i, path in enumerate(files):
        name = os.path.splitext(os.path.basename(path))[0]
        with open(path) as f:
            d = json.load(f)
        with open(f"{out_dir}/{name}.params.json", "w") as f:
            json.dump(params(d), f)
        c = cut(name, d)
        torch.manual_seed(3000 + i)
        model = AutoModelForCausalLM.from_config(load_config(c), dtype=torch.float32).eval()
        with torch.no_grad():  # norms at 1 and biases at 0 would hide mistakes
            for pname, p in model.named_parameters():
                if "norm" in pname:
                    p.copy_(1 + 0.2 * torch.randn_like(p))
                elif pname.endswith("bias"):
                    p.copy_(0.1 * torch.randn_like(p))
                else:
                    p.copy_(0.05 * torch.randn_like(p))
        mdir = f"{out_dir}/{name}"
        model.save_pretrained(mdir)
        with open(f"{mdir}/config.json", "w") as f:  # the published spelling, sizes cut
            json.dump(c, f, indent=2)
        model = AutoModelForCausalLM.from_pretrained(mdir, dtype=torch.float32, attn_implementation="sdpa").eval()
        ids, mask, pos = padded_batch(4000 + i)
        with torch.no_grad():
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
        save_file({"input_ids": ids, "attention_mask": mask, "position_ids": pos,
                   "logits": logits.float().contiguous(),
                   "num_parameters": torch.tensor([model.num_parameters()], dtype=torch.int64)},
                  f"{out_dir}/{name}.ref.safetensors")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
