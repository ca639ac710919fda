"""Oracle for `rpg eval --scored-output` (tests/eval/real_model_cli_test.cpp): scores every
line of a JSON-lines file that has "response" and "ground_truth" with verl's
math_dapo.compute_score (the rule verl applies to math_dapo / aime* / amc*) and prints one
{"score", "acc", "pred"} line per input line, in order.

usage: eval_scored.py FILE.jsonl
"""
import json
import sys

from verl.utils.reward_score import math_dapo

for line in open(sys.argv[1], encoding="utf-8"):
    if not line.strip():
        continue
    r = json.loads(line)
    s = math_dapo.compute_score(r["response"], r["ground_truth"])
    print(json.dumps({"score": float(s["score"]), "acc": bool(s["acc"]), "pred": s["pred"]}))
