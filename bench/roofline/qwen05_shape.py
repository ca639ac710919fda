"""Writes a randomly initialised model of Qwen2.5-0.5B's shape (hidden 896, 24 layers, 14 query
and 2 KV heads of 64, MLP 4864, vocab 151936, tied embeddings, rope_theta 1e6; 494 M
parameters) with transformers, for the benchmarks that need that shape and no real weights
(docs/benchmarks.md: the roofline's and scaling's `/tmp/qwen05`).

    .venv/bin/python bench/roofline/qwen05_shape.py /tmp/qwen05
"""
import argparse

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", help="directory to write (config.json, model.safetensors)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    config = Qwen2Config(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True,
                         rope_theta=1e6, max_position_embeddings=32768, torch_dtype="float32")
    model = Qwen2ForCausalLM(config)
    model.save_pretrained(args.out, safe_serialization=True)
    print(f"{args.out}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters")


if __name__ == "__main__":
    main()
