"""transformers side of bench/model/model_bench.cpp.

  model_hf_bench.py make <dir> <vocab> <hidden> <layers> <heads> <kv_heads> <intermediate>
      Saves a random Qwen2 model of that shape (fp32) into <dir>.
  model_hf_bench.py time <dir> <batch> <seq> <repeats> <threads>
      Times transformers' forward (logits) and log-prob computation (forward, fp32
      log_softmax at temperature 0.7, gather, entropy) on a random batch, without grad.
      and greedy generation of 64 tokens after 64-token prompts with the KV cache.
      Prints one JSON line: {"forward_s", "log_probs_s", "generate_s"} (median seconds).
"""
import json
import statistics
import sys
import time

import torch
from transformers import AutoModelForCausalLM, Qwen2Config


PROMPT, NEW = 64, 64  # generation benchmark: prompt tokens, new tokens per row


def make(d, vocab, hidden, layers, heads, kv, inter):
    torch.manual_seed(0)
    cfg = Qwen2Config(vocab_size=vocab, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=kv, intermediate_size=inter, max_position_embeddings=8192)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(d)


def timed(fn, repeats):
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return statistics.median(ts)


def run(d, batch, seq, repeats, threads):
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float32, attn_implementation="sdpa").eval()
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, seq), generator=g)
    mask = torch.ones_like(ids)

    def forward():
        with torch.no_grad():
            return model(input_ids=ids, attention_mask=mask).logits

    def log_probs():
        with torch.no_grad():
            z = model(input_ids=ids, attention_mask=mask).logits[:, :-1].float() / 0.7
            lp = torch.log_softmax(z, -1)
            return lp.gather(-1, ids[:, 1:, None]).squeeze(-1), -(lp.exp() * lp).sum(-1)

    def generate():  # greedy, KV cache, exactly NEW tokens per row
        with torch.no_grad():
            return model.generate(input_ids=ids[:, :PROMPT], attention_mask=mask[:, :PROMPT], max_new_tokens=NEW,
                                  min_new_tokens=NEW, do_sample=False, pad_token_id=0)

    print(json.dumps({"forward_s": timed(forward, repeats), "log_probs_s": timed(log_probs, repeats),
                      "generate_s": timed(generate, repeats)}))


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(sys.argv[2], *map(int, sys.argv[3:9]))
    else:
        run(sys.argv[2], *map(int, sys.argv[3:7]))
