"""A complete tiny chat model directory, made with Hugging Face libraries only (nothing is
downloaded): a Qwen2-style byte-level BPE tokenizer trained with `tokenizers` on a local
corpus, the real Qwen2.5 chat template, and a random Qwen2 model with the matching vocabulary
saved by transformers. Then greedy generate() references through transformers' own
tokenizer + chat template + model.

usage: tiny_chat_model.py OUT_DIR [PROMPT ...]
  OUT_DIR/model/              config.json, model.safetensors, tokenizer.json,
                              tokenizer_config.json, generation_config.json
  OUT_DIR/reference.json      [{"prompt", "prompt_ids", "response_ids", "response"}] for each
                              PROMPT (user message), greedy, MAX_NEW tokens, stop at <|im_end|>
  OUT_DIR/model_info.json     {"num_parameters"} as transformers counts them
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2Config  # noqa: E402

import tokenizer_oracle  # noqa: E402
import tokenizer_templates  # noqa: E402

MAX_NEW = 12

out = sys.argv[1]
prompts = sys.argv[2:]
model_dir = os.path.join(out, "model")
os.makedirs(model_dir, exist_ok=True)

data = tokenizer_oracle.finish(
    tokenizer_oracle.train("tiny", tokenizer_oracle.QWEN2_RE, tokenizer_oracle.QWEN_SPECIAL, [], True, False, vocab=700),
    "qwen2")
with open(os.path.join(model_dir, "tokenizer.json"), "w") as f:
    json.dump(data, f, ensure_ascii=False)
with open(os.path.join(model_dir, "tokenizer_config.json"), "w") as f:
    json.dump({"tokenizer_class": "Qwen2Tokenizer", "bos_token": None, "eos_token": "<|im_end|>",
               "pad_token": "<|endoftext|>", "chat_template": tokenizer_templates.QWEN25,
               "model_max_length": 512}, f)

vocab = max(max(data["model"]["vocab"].values()), max(a["id"] for a in data["added_tokens"])) + 1
tok = AutoTokenizer.from_pretrained(model_dir)
im_end, endoftext = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")

torch.manual_seed(0)
config = Qwen2Config(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                     rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.3, bos_token_id=None, eos_token_id=im_end,
                     pad_token_id=endoftext)
model = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa").eval()
model.save_pretrained(model_dir)
with open(os.path.join(out, "model_info.json"), "w") as f:
    json.dump({"num_parameters": sum(p.numel() for p in model.parameters())}, f)
GenerationConfig(eos_token_id=[im_end, endoftext], pad_token_id=endoftext).save_pretrained(model_dir)

refs = []
for p in prompts:
    text = tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
    ids = tok(text, add_special_tokens=False, return_tensors="pt").input_ids
    with torch.no_grad():
        o = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW,
                           eos_token_id=[im_end, endoftext], pad_token_id=endoftext)
    resp = o[0, ids.shape[1]:].tolist()
    refs.append({"prompt": text, "prompt_ids": ids[0].tolist(), "response_ids": resp,
                 "response": tok.decode(resp, skip_special_tokens=True)})
with open(os.path.join(out, "reference.json"), "w") as f:
    json.dump(refs, f, ensure_ascii=False)
