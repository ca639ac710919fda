"""Oracle for the eval metrics: an independent Python computation plus verl's own
process_validation_metrics on the same scored responses.

usage: eval_metrics.py IN.json OUT.json
IN: [{"data_source", "problem", "score", "acc", "pred"}...]
OUT: {"exact": {ds: {metric: value}}, "verl": {ds: {"acc/best@4/mean": ...}}}
  exact: mean@n / std@n (numpy), pass@k = 1 - C(n-c,k)/C(n,k) (math.comb, exact fractions),
         maj@n = verl's calc_maj_val on all n responses, best@k / worst@k as exact
         expectations over k draws with replacement (via the empirical CDF of distinct values)
  verl:  verl.trainer.ppo.metric_utils.process_validation_metrics (bootstrap, seed 42)
"""
import json
import math
import sys
from collections import OrderedDict, defaultdict
from fractions import Fraction

import numpy as np
from verl.trainer.ppo.metric_utils import calc_maj_val, process_validation_metrics


def sizes(n, start):
    out, k = [], start
    while k < n:
        out.append(k)
        k *= 2
    out.append(n)
    return out


def extreme(vals, k, use_max):
    n = len(vals)
    distinct = sorted(set(vals), reverse=not use_max)
    probs = []
    below = 0
    for v in distinct:
        cnt = sum(1 for x in vals if x == v)
        probs.append(((below + cnt) / n) ** k - (below / n) ** k)
        below += cnt
    mean = sum(p * v for p, v in zip(probs, distinct))
    return mean, math.sqrt(sum(p * (v - mean) ** 2 for p, v in zip(probs, distinct)))


def main():
    rows = json.load(open(sys.argv[1]))
    groups = defaultdict(OrderedDict)
    for r in rows:
        groups[r["data_source"]].setdefault(r["problem"], []).append(r)
    exact = {}
    for ds, problems in groups.items():
        sums = defaultdict(list)
        for resp in problems.values():
            n = len(resp)
            preds = [r["pred"] for r in resp]
            for var in ("acc", "score"):
                vals = [float(r[var]) for r in resp]
                sums[f"{var}/mean@{n}"].append(float(np.mean(vals)))
                if n > 1:
                    sums[f"{var}/std@{n}"].append(float(np.std(vals)))
                    for k in sizes(n, 2):
                        for name, use_max in (("best", True), ("worst", False)):
                            m, s = extreme(vals, k, use_max)
                            sums[f"{var}/{name}@{k}/mean"].append(m)
                            sums[f"{var}/{name}@{k}/std"].append(s)
                    if all(p is not None for p in preds):
                        sums[f"{var}/maj@{n}"].append(
                            calc_maj_val([{"val": v, "pred": p} for v, p in zip(vals, preds)], "pred", "val"))
            c = sum(1 for r in resp if r["acc"])
            for k in sizes(n, 1) if n > 1 else [1]:
                sums[f"acc/pass@{k}"].append(float(1 - Fraction(math.comb(n - c, k), math.comb(n, k))))
        table = {name: sum(v) / len(v) for name, v in sums.items()}
        table["num_problems"] = float(len(problems))
        table["num_responses"] = float(sum(len(v) for v in problems.values()))
        exact[ds] = table

    verl = process_validation_metrics(
        [r["data_source"] for r in rows],
        [r["data_source"] + "\x00" + r["problem"] for r in rows],
        {"acc": [float(r["acc"]) for r in rows], "score": [r["score"] for r in rows],
         "pred": [r["pred"] for r in rows]},
    )
    flat = {ds: {f"{var}/{m}": float(v) for var, ms in d.items() for m, v in ms.items()} for ds, d in verl.items()}
    json.dump({"exact": exact, "verl": flat}, open(sys.argv[2], "w"))


if __name__ == "__main__":
    main()
