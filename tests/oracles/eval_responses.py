"""Oracle for `rpg eval --responses`: scores a responses JSONL file (rpg generate's format)
with verl's math_dapo.compute_score -- the rule verl applies to math_dapo / aime* / amc* --
and computes the metrics with eval_metrics.py's independent Python implementation.

usage: eval_responses.py RESPONSES.jsonl   (prints {data_source: {metric: value}} as JSON)
"""
import json
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from verl.utils.reward_score import math_dapo  # noqa: E402

import eval_metrics  # noqa: E402

rows = []
for line in open(sys.argv[1], encoding="utf-8"):
    if not line.strip():
        continue
    r = json.loads(line)
    s = math_dapo.compute_score(r["response"], r["ground_truth"])
    rows.append({"data_source": r["data_source"], "problem": r["prompt"], "score": float(s["score"]),
                 "acc": bool(s["acc"]), "pred": s["pred"]})
with tempfile.TemporaryDirectory() as d:
    scored, metrics = os.path.join(d, "scored.json"), os.path.join(d, "metrics.json")
    json.dump(rows, open(scored, "w"))
    sys.argv = [sys.argv[0], scored, metrics]
    eval_metrics.main()
    print(json.dumps(json.load(open(metrics))["exact"]))
