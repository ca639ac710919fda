"""Oracle for `rpg tokenize --jsonl` (tests/eval/real_model_cli_test.cpp): the same input
format, tokenized by transformers.

  tokenize_jsonl.py MODEL_DIR IN.jsonl [--chat] [--add-special-tokens] [--chat-template-kwargs JSON]

Each input line is a JSON string, an object with "text", or an object with "messages". A
text (with --chat: the text as one user message) or a message list is rendered with
AutoTokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False,
**kwargs) -- how verl renders a prompt with data.apply_chat_template_kwargs -- and encoded
with add_special_tokens as given. Prints one {"ids", "num_tokens", "text"} line per input line.
"""
import argparse
import json

from transformers import AutoTokenizer

ap = argparse.ArgumentParser()
ap.add_argument("model_dir")
ap.add_argument("input")
ap.add_argument("--chat", action="store_true")
ap.add_argument("--add-special-tokens", action="store_true")
ap.add_argument("--chat-template-kwargs", default="{}")
a = ap.parse_args()
tok = AutoTokenizer.from_pretrained(a.model_dir)
kwargs = json.loads(a.chat_template_kwargs)


def render(messages):
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, **kwargs)


for line in open(a.input, encoding="utf-8"):
    if not line.strip():
        continue
    j = json.loads(line)
    if isinstance(j, str):
        text = render([{"role": "user", "content": j}]) if a.chat else j
    elif "messages" in j:
        text = render(j["messages"])
    else:
        text = render([{"role": "user", "content": j["text"]}]) if a.chat else j["text"]
    ids = tok(text, add_special_tokens=a.add_special_tokens)["input_ids"]
    print(json.dumps({"ids": ids, "num_tokens": len(ids), "text": text}))
