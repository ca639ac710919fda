"""The model's work from its config.json: one FLOP and byte model for roofline.py and
scaling.py (and for whatever they compare: rpg, transformers).

FLOPs: 2 per weight per token through every projection, the lm_head only where logits are
used, attention's QK^T and PV over the keys each query sees; backward = 2 x forward. Bytes
(decode): the weights once per step plus each sequence's K/V.
"""
import json
import os


class ModelWork:
    def __init__(self, model_dir, bytes_per_value):
        cfg = json.load(open(os.path.join(model_dir, "config.json")))
        self.config = cfg
        self.C, self.L, self.V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
        self.H = cfg["num_attention_heads"]
        self.Hkv = cfg.get("num_key_value_heads", self.H)
        self.D = cfg.get("head_dim") or self.C // self.H
        self.I = cfg["intermediate_size"]
        C, H, Hkv, D, I = self.C, self.H, self.Hkv, self.D, self.I
        self.layer_shapes = [(H * D, C), (Hkv * D, C), (Hkv * D, C), (C, H * D), (I, C), (I, C), (C, I)]  # (out, in)
        self.layer_weights = sum(o * i for o, i in self.layer_shapes)
        self.bytes = bytes_per_value

    def forward_flops(self, tokens, keys_seen, logits):
        """tokens through the layers; keys_seen = sum over those tokens of the keys each attends to;
        logits = positions whose lm_head row is computed."""
        return (2 * tokens * self.L * self.layer_weights + self.L * 4 * self.H * self.D * keys_seen
                + 2 * logits * self.C * self.V)

    @staticmethod
    def causal_keys(n):
        return n * (n + 1) // 2

    def work(self, m):
        """(FLOPs, bytes or None) of one roofline_bench measurement line."""
        if m["phase"] == "optimizer":  # AdamW: 4 arrays of fp32 read, 3 written; ~12 FLOPs per parameter
            return 12 * m["params"], 7 * 4 * m["params"]
        P = m["prompt_len"]
        if m["phase"] == "decode":
            S, T = m["seqs"], m["new_tokens"]
            steps = range(1, T)  # step k feeds token k-1 of the response at position P+k-1: P+k keys
            flops = sum(self.forward_flops(S, S * (P + k), S) for k in steps)
            weight_bytes = (self.L * self.layer_weights + self.C * self.V) * self.bytes
            kv_bytes = sum(S * self.L * 2 * self.Hkv * self.D * (P + k) * self.bytes for k in steps)
            return flops, len(steps) * weight_bytes + kv_bytes
        if m["phase"] == "prefill":
            return self.forward_flops(m["seqs"] * P, m["seqs"] * self.causal_keys(P), m["seqs"]), None
        B, R = m["rows"], m["response"]
        f = self.forward_flops(B * (P + R), B * self.causal_keys(P + R), B * R)
        return (3 * f if m["phase"] == "update" else f), None
