"""Oracle for tests/real: what Hugging Face `tokenizers` and `transformers` make of the real
SmolLM2-135M-Instruct directory (scripts/get_model.sh), read as transformers reads it.

    real_smollm2.py OUT tokenizer MODEL   OUT/cases.jsonl: per string (hex) the ids and both
                                          decodes of tokenizers.Tokenizer.from_file, and
                                          OUT/chat.jsonl: transformers' apply_chat_template
                                          prompts (text and ids) of several conversations
    real_smollm2.py OUT logits MODEL      OUT/logits.safetensors: a verl-layout padded batch of
                                          real text (input_ids, attention_mask, position_ids)
                                          and transformers' fp32 logits; num_parameters
    real_smollm2.py OUT greedy MODEL N P...  OUT/greedy.jsonl: for each user prompt P, the chat
                                          prompt and generate()'s greedy response ids (N new
                                          tokens at most, stopping at generation_config's eos)
"""
import json
import os
import sys

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_oracle  # noqa: E402
import tokenizer_hf_variants  # noqa: E402

CHAT_SNIPPETS = [
    [{"role": "user", "content": "What is 12 + 7? Answer with a number."}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}],
    [{"role": "user", "content": "Solve $x^2 - 5x + 6 = 0$. Put the answer in \\boxed{}."},
     {"role": "assistant", "content": "The roots are 2 and 3, so \\boxed{2, 3}."},
     {"role": "user", "content": "And x^2 = 9?"}],
    [{"role": "user", "content": "控制字符 \x04\x06 and emoji 👍🏽 and tabs\tand\nnewlines"}],
    [{"role": "user", "content": ""}],
]


def cmd_tokenizer(model, out):
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    strings = tokenizer_oracle.test_strings() + tokenizer_hf_variants.every_byte_strings()
    with open(os.path.join(out, "cases.jsonl"), "w", encoding="utf-8") as f:
        for b in strings:
            text = b.decode("utf-8", errors="replace")
            ids = tok.encode(text, add_special_tokens=False).ids
            f.write(json.dumps({"hex": b.hex(), "ids": ids,
                                "sp": tok.encode(text, add_special_tokens=True).ids,
                                "dec": tok.decode(ids, skip_special_tokens=False).encode("utf-8").hex(),
                                "skip": tok.decode(ids, skip_special_tokens=True).encode("utf-8").hex()}) + "\n")
    from transformers import AutoTokenizer
    auto = AutoTokenizer.from_pretrained(model, local_files_only=True)
    with open(os.path.join(out, "chat.jsonl"), "w", encoding="utf-8") as f:
        for msgs in CHAT_SNIPPETS:
            for gen in (True, False):
                text = auto.apply_chat_template(msgs, add_generation_prompt=gen, tokenize=False)
                ids = auto(text, add_special_tokens=False)["input_ids"]
                f.write(json.dumps({"messages": msgs, "add_generation_prompt": gen, "text": text, "ids": ids}) + "\n")


def load_model(model):
    from transformers import AutoModelForCausalLM
    m, info = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32, output_loading_info=True,
                                                   attn_implementation="sdpa")
    bad = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if bad:
        sys.exit(f"{model}: transformers reports {bad}")
    return m.eval()


def cmd_logits(model, out):
    os.makedirs(out, exist_ok=True)
    tok = Tokenizer.from_file(os.path.join(model, "tokenizer.json"))
    texts = ["The capital of France is Paris. The capital of Germany is", "12 + 7 =",
             "def fibonacci(n):\n    if n < 2:\n        return n\n    return", "Once upon a time, in a land far"]
    rows = [tok.encode(t, add_special_tokens=False).ids for t in texts]
    T = max(len(r) for r in rows)
    ids = torch.zeros(len(rows), T, dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.long)
    for i, r in enumerate(rows):  # left padding, as verl lays out prompts
        ids[i, T - len(r):] = torch.tensor(r)
        mask[i, T - len(r):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    m = load_model(model)
    with torch.no_grad():
        logits = m(input_ids=ids, attention_mask=mask, position_ids=pos).logits
    save_file({"input_ids": ids, "attention_mask": mask, "position_ids": pos, "logits": logits.float().contiguous(),
               "num_parameters": torch.tensor([m.num_parameters()], dtype=torch.int64)},
              os.path.join(out, "logits.safetensors"))


def cmd_greedy(model, out, max_new, prompts):
    os.makedirs(out, exist_ok=True)
    from transformers import AutoTokenizer
    auto = AutoTokenizer.from_pretrained(model, local_files_only=True)
    m = load_model(model)
    with open(os.path.join(out, "greedy.jsonl"), "w", encoding="utf-8") as f:
        for p in prompts:
            text = auto.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                            tokenize=False)
            ids = auto(text, add_special_tokens=False, return_tensors="pt")["input_ids"]
            with torch.no_grad():
                gen = m.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=max_new)
            resp = gen[0, ids.shape[1]:].tolist()
            f.write(json.dumps({"prompt": text, "response_ids": resp,
                                "response": auto.decode(resp, skip_special_tokens=True)}) + "\n")


if __name__ == "__main__":
    torch.set_num_threads(1)
    out, cmd, model = sys.argv[1], sys.argv[2], sys.argv[3]
    if cmd == "tokenizer":
        cmd_tokenizer(model, out)
    elif cmd == "logits":
        cmd_logits(model, out)
    elif cmd == "greedy":
        cmd_greedy(model, out, int(sys.argv[4]), sys.argv[5:])
    else:
        sys.exit(f"unknown command {cmd}")
