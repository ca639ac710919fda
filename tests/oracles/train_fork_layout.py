"""Oracle: the rows each optimizer step of the authors' verl fork sees, rank by rank and
micro-batch by micro-batch, on W data-parallel ranks:

  RayPPOTrainer._balance_batch   the fork's own method (fork_modules.balance_batch), with
                                 trainer.balance_batch
  dispatch                       DataProto.chunk(W) (verl's DP_COMPUTE_PROTO: rank r the r-th
                                 equal chunk)
  fsdp_workers.py:117-118        ppo_mini_batch_size * n // W rows per rank mini-batch
  dp_actor.update_policy         batch.split(that) (TensorDict.split), then per mini-batch
                                 rearrange_micro_batches as of the fork (k = ceil(tokens /
                                 max_token_len), get_seqlen_balanced_partitions equal_size=False)
                                 with use_dynamic_bsz, else mini_batch.split(micro_size)

usage: train_fork_layout.py FORK_DIR IN.json OUT.json
IN: [{"lengths": [...], "width": T, "world": W, "mini_rows": ppo_mini_batch_size * n,
      "balance": bool, "use_dynamic_bsz": bool, "max_token_len": M, "micro_size": m}, ...]
OUT per case: [mini-batch][rank][micro-batch] -> the batch's original row indices.
"""
import json
import math
import sys
from types import SimpleNamespace

import torch
from tensordict import TensorDict
from verl import DataProto
from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

import fork_modules

fork_dir, in_path, out_path = sys.argv[1:4]
balance_batch = fork_modules.balance_batch(fork_dir)
out = []
for c in json.load(open(in_path)):
    B, W = len(c["lengths"]), c["world"]
    attention_mask = torch.zeros(B, c["width"], dtype=torch.int64)
    for i, n in enumerate(c["lengths"]):
        attention_mask[i, c["width"] - n:] = 1  # left-padded prompt + response
    data = DataProto(batch=TensorDict({"attention_mask": attention_mask, "row": torch.arange(B)}, batch_size=[B]))
    if c["balance"]:
        balance_batch(SimpleNamespace(actor_rollout_wg=SimpleNamespace(world_size=W)), data, metrics={})
    per_rank_mini = c["mini_rows"] // W
    layout = []
    for rank, chunk in enumerate(data.chunk(W)):
        for m, mini in enumerate(chunk.batch.split(per_rank_mini)):
            if m == len(layout):
                layout.append([])
            if c["use_dynamic_bsz"]:
                lengths = mini["attention_mask"].sum(-1)
                k = math.ceil(lengths.sum().item() / c["max_token_len"])
                parts = get_seqlen_balanced_partitions(lengths.tolist(), k, equal_size=False)
                micro = [[int(mini["row"][i]) for i in p] for p in parts]
            else:
                micro = [piece["row"].tolist() for piece in mini.split(c["micro_size"])]
            layout[m].append(micro)
    out.append(layout)
json.dump(out, open(out_path, "w"))
