"""Live PEFT oracle for rpg's LoRA (tests/model/lora_test.cpp).

  model_lora_peft.py make <out_dir> <models_dir> <name> ...
      For each model <models_dir>/<name> (made by model_hf.py make, with its
      <name>.ref.safetensors batch) and each adapter case below: wraps the model with PEFT's
      LoRA (init_lora_weights=False, so lora_B is random and the adapter changes the output),
      saves the adapter with save_pretrained into <out_dir>/<name>.<case>/ and writes
      <out_dir>/<name>.<case>.ref.safetensors: the logits of the ref batch, the loss
      sum(log_softmax(logits)[next token] * w) over attended positions and its gradient
      for every adapter tensor (grad.<PEFT saved name>), w = a fixed random weight.
      Also writes merge_and_unload()'s model to <out_dir>/<name>.<case>.merged/.
  model_lora_peft.py logits <base_dir> <adapter_dir> <ref.safetensors> <out.safetensors>
      Loads an adapter directory (e.g. one written by rpg) onto the base model with
      PeftModel.from_pretrained and writes the logits of the ref batch.
  model_lora_peft.py bf16 <base_dir> <adapter_dir> <ref.safetensors> <out.safetensors>
      The base loaded in bfloat16 and the adapter with PeftModel.from_pretrained's defaults,
      which keep adapters of a bf16 model in fp32 (autocast_adapter_dtype): the logits of the
      ref batch (as fp32), and the loss of make (with the ref file's loss_weight) and its
      gradient for every adapter tensor.
"""
import sys

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from peft.utils import get_peft_model_state_dict
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

CASES = {
    "all": dict(r=4, lora_alpha=8, target_modules="all-linear", use_rslora=False),
    "some": dict(r=3, lora_alpha=5, target_modules=["q_proj", "v_proj", "down_proj"], use_rslora=False),
    "rslora": dict(r=4, lora_alpha=6, target_modules=["k_proj", "o_proj", "gate_proj", "up_proj"], use_rslora=True),
}


def batch(ref_path):
    ref = load_file(ref_path)
    return ref["input_ids"], ref["attention_mask"], ref["position_ids"]


def loss_of(logits, ids, mask, weight):
    logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logp.gather(-1, ids[:, 1:].unsqueeze(-1)).squeeze(-1)
    valid = (mask[:, :-1] * mask[:, 1:]).float()
    return (picked * valid * weight).sum()


def make(out_dir, models_dir, names):
    for name in names:
        ids, mask, pos = batch(f"{models_dir}/{name}.ref.safetensors")
        for case, kwargs in CASES.items():
            torch.manual_seed(7)
            base = AutoModelForCausalLM.from_pretrained(f"{models_dir}/{name}", torch_dtype=torch.float32)
            config = LoraConfig(lora_dropout=0.0, bias="none", task_type="CAUSAL_LM", init_lora_weights=False, **kwargs)
            model = get_peft_model(base, config)
            model.save_pretrained(f"{out_dir}/{name}.{case}")
            g = torch.Generator().manual_seed(11)
            weight = torch.rand(ids.shape[0], ids.shape[1] - 1, generator=g) * 2 - 1
            logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
            loss = loss_of(logits, ids, mask, weight)
            loss.backward()
            out = {"logits": logits.detach().float().contiguous(), "loss": loss.detach().reshape(1),
                   "loss_weight": weight.contiguous()}
            # The saved names (adapter name dropped) are the names rpg uses.
            saved = get_peft_model_state_dict(model)
            by_id = {id(p): n for n, p in model.named_parameters()}
            for saved_name, tensor in saved.items():
                live = dict(model.named_parameters())
                key = [n for n in live if n.replace(".default", "") == saved_name]
                assert len(key) == 1, (saved_name, key)
                out["grad." + saved_name] = live[key[0]].grad.detach().contiguous()
            del by_id
            save_file(out, f"{out_dir}/{name}.{case}.ref.safetensors")
            merged = model.merge_and_unload()
            merged.save_pretrained(f"{out_dir}/{name}.{case}.merged")


def logits(base_dir, adapter_dir, ref_path, out_path):
    ids, mask, pos = batch(ref_path)
    base = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.float32)
    model = PeftModel.from_pretrained(base, adapter_dir)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    save_file({"logits": out.float().contiguous()}, out_path)


def bf16(base_dir, adapter_dir, ref_path, out_path):
    ids, mask, pos = batch(ref_path)
    weight = load_file(ref_path)["loss_weight"]
    base = AutoModelForCausalLM.from_pretrained(base_dir, torch_dtype=torch.bfloat16)
    model = PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)
    for n, p in model.named_parameters():
        assert ("lora_" in n) == (p.dtype == torch.float32), (n, p.dtype)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    loss = loss_of(logits, ids, mask, weight)
    loss.backward()
    out = {"logits": logits.detach().float().contiguous(), "loss": loss.detach().float().reshape(1)}
    for n, p in model.named_parameters():
        if p.grad is not None:
            out["grad." + n.replace(".default", "")] = p.grad.detach().float().contiguous()
    save_file(out, out_path)


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], sys.argv[3], sys.argv[4:])
    elif sys.argv[1] == "logits":
        logits(*sys.argv[2:6])
    elif sys.argv[1] == "bf16":
        bf16(*sys.argv[2:6])
    else:
        sys.exit(f"unknown mode {sys.argv[1]}")
