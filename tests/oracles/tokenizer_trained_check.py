"""Oracle for tests/tokenizer/bpe_trainer_test.cpp: a corpus to train on, and what Hugging
Face does with the tokenizer.json that rpg's BPE trainer wrote.

    tokenizer_trained_check.py OUT          OUT/corpus.jsonl (one JSON string per training
                                            text, tokenizer_oracle's generated corpus) and
                                            OUT/strings.jsonl (hex bytes of the test strings)
    tokenizer_trained_check.py check DIR    loads DIR/tokenizer.json with `tokenizers` and
                                            DIR with transformers' AutoTokenizer; prints one
                                            JSON line per test string: {"hex", "ids", "auto_ids",
                                            "dec"} (dec: hex of the decode of ids)
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import tokenizer_oracle  # noqa: E402


def cmd_corpus(out):
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, "corpus.jsonl"), "w", encoding="utf-8") as f:
        for line in tokenizer_oracle.corpus():
            f.write(json.dumps(line) + "\n")
    with open(os.path.join(out, "strings.jsonl"), "w", encoding="utf-8") as f:
        for b in tokenizer_oracle.test_strings():
            f.write(json.dumps(b.hex()) + "\n")


def cmd_check(d):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tok = Tokenizer.from_file(os.path.join(d, "tokenizer.json"))
    auto = AutoTokenizer.from_pretrained(d)
    for b in tokenizer_oracle.test_strings():
        text = b.decode("utf-8", errors="replace")
        ids = tok.encode(text, add_special_tokens=False).ids
        auto_ids = auto(text, add_special_tokens=False)["input_ids"]
        dec = tok.decode(ids, skip_special_tokens=False)
        print(json.dumps({"hex": b.hex(), "ids": ids, "auto_ids": auto_ids, "dec": dec.encode("utf-8").hex()}))


if __name__ == "__main__":
    if sys.argv[1] == "check":
        cmd_check(sys.argv[2])
    else:
        cmd_corpus(sys.argv[1])
