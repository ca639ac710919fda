"""Oracle: the fork's use_dynamic_bsz micro-batch partition (rearrange_micro_batches as of the
fork: k = ceil(sum(lengths) / max_token_len), then verl's get_seqlen_balanced_partitions(
lengths, k, equal_size=False)), from the installed verl's seqlen_balancing.

usage: train_fork_partitions.py IN.json OUT.json
IN: [{"lengths": [...], "max_token_len": M}, ...]; OUT: [[[row, ...], ...], ...] per case.
"""
import json
import math
import sys

from verl.utils.seqlen_balancing import get_seqlen_balanced_partitions

cases = json.load(open(sys.argv[1]))
out = []
for c in cases:
    k = math.ceil(sum(c["lengths"]) / c["max_token_len"])
    out.append(get_seqlen_balanced_partitions(c["lengths"], k, equal_size=False))
json.dump(out, open(sys.argv[2], "w"))
