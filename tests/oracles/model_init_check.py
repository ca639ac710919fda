"""Oracle for tests/init: loads a model directory written by `rpg model init` with
transformers and reports what it finds.

usage: model_init_check.py MODEL_DIR
prints one JSON object:
  missing, unexpected, mismatched   from from_pretrained(output_loading_info=True)
  num_parameters                    as transformers counts them
  model_type, tie                   from the loaded config
  generation_eos                    generation_config.eos_token_id
  chat                              [{"messages", "add_generation_prompt", "text"}] rendered by
                                    AutoTokenizer.apply_chat_template
  ids, logits                       token ids of the first chat text and the logits of its last
                                    position (float32)
"""
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

CONVERSATIONS = [
    ([{"role": "user", "content": "What is 3 + 4?"}], True),
    ([{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Solve x + 2 = 5."}], True),
    ([{"role": "user", "content": "héllo 你好 👍"}, {"role": "assistant", "content": "Answer: 7"},
      {"role": "user", "content": "again\nplease"}], False),
]

d = sys.argv[1]
model, info = AutoModelForCausalLM.from_pretrained(d, output_loading_info=True, dtype=torch.float32)
model.eval()
tok = AutoTokenizer.from_pretrained(d)
gen = GenerationConfig.from_pretrained(d)
chat = []
for messages, gp in CONVERSATIONS:
    chat.append({"messages": messages, "add_generation_prompt": gp,
                 "text": tok.apply_chat_template(messages, add_generation_prompt=gp, tokenize=False)})
ids = tok(chat[0]["text"], add_special_tokens=False)["input_ids"]
with torch.no_grad():
    logits = model(torch.tensor([ids])).logits[0, -1].float().tolist()
print(json.dumps({
    "missing": sorted(info["missing_keys"]), "unexpected": sorted(info["unexpected_keys"]),
    "mismatched": [str(m) for m in info["mismatched_keys"]],
    "num_parameters": sum(p.numel() for p in model.parameters()),
    "model_type": model.config.model_type, "tie": bool(model.config.tie_word_embeddings),
    "generation_eos": gen.eos_token_id, "chat": chat, "ids": ids, "logits": logits,
}, ensure_ascii=False))
