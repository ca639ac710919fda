"""Independent computation of the run-comparison table (the paper's Table 3 layout) from run
directories' metrics.jsonl, for the report render test. Written from the report's stated
definitions, not from its C++:
  - a record is one JSON object per line with an integer "step"; a line that does not parse
    is skipped only when it is the file's last line (a run killed mid-write);
  - a step logged twice (a resumed run) keeps its later value; null (NaN / inf) is no value;
  - headline metrics: keys matching ^val-core/.+/mean@[0-9]+$; with --all as the first
    argument, every validation metric (keys starting val-core/ or val-aux/);
  - start: the value at the smallest step; last: at the largest step; best: the highest value
    at a step > 0 (over all steps when none is > 0), the earliest such step on ties.

usage: table3_oracle.py [--all] RUN_DIR... -> JSON {run_dir: {metric: {start, last, best, best_step}}}
"""
import json
import math
import re
import sys

HEADLINE = re.compile(r"^val-core/.+/mean@[0-9]+$")
ALL_VALIDATION = re.compile(r"^val-(core|aux)/")


def read_metrics(path, wanted):
    with open(path, encoding="utf-8") as f:
        lines = [line for line in f.read().split("\n") if line.strip()]
    values = {}
    for i, line in enumerate(lines):
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines) - 1:
                continue
            raise
        step = record.get("step")
        if not isinstance(step, (int, float)):
            continue
        for key, value in record.items():
            if key == "step" or not wanted.match(key):
                continue
            per_step = values.setdefault(key, {})
            if isinstance(value, (int, float)) and math.isfinite(value):
                per_step[step] = float(value)
            else:
                per_step.pop(step, None)
    return values


def main():
    args = sys.argv[1:]
    wanted = HEADLINE
    if args and args[0] == "--all":
        wanted, args = ALL_VALIDATION, args[1:]
    out = {}
    for run in args:
        table = {}
        for key, per_step in read_metrics(run + "/metrics.jsonl", wanted).items():
            if not per_step:
                continue
            steps = sorted(per_step)
            after = [s for s in steps if s > 0] or steps
            best_step = min(after, key=lambda s: (-per_step[s], s))
            table[key] = {"start": per_step[steps[0]], "last": per_step[steps[-1]],
                          "best": per_step[best_step], "best_step": best_step}
        out[run] = table
    print(json.dumps(out))


if __name__ == "__main__":
    main()
