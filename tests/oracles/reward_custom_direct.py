"""Calls a verl-style reward function directly, in this Python, the way verl's naive reward
manager does (compute_score(data_source, solution_str, ground_truth, extra_info, **kwargs)),
on requests read from a JSON-lines file; prints one JSON result per line: {"score": x} or
the dict the function returned. The oracle of rpg's Python reward pool (tests/reward).

usage: reward_custom_direct.py FILE NAME REQUESTS.jsonl [KWARGS_JSON]
"""
import importlib.util
import json
import sys


def main():
    path, name, requests = sys.argv[1], sys.argv[2], sys.argv[3]
    kwargs = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    spec = importlib.util.spec_from_file_location("direct_reward_module", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    function = getattr(module, name)
    with open(requests, encoding="utf-8") as f:
        for line in f:
            q = json.loads(line)
            result = function(q["data_source"], q["solution_str"], q["ground_truth"], q.get("extra_info"), **kwargs)
            print(json.dumps(result if isinstance(result, dict) else {"score": float(result)}))


if __name__ == "__main__":
    main()
