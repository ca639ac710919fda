"""Oracle: the authors' fork's math_dapo.compute_score (loaded unchanged from the fork
provisioned by scripts/setup.sh) on the same corpus as reward_cases.py (same generator, same
seed and sizes give the same pairs), default and strict_box_verify=True.

usage: reward_fork_cases.py FORK_DIR OUT.jsonl [--seed S] [--generated N] [--soup M]
Each line: {"r": hex, "g": hex, "fork": [score, acc, hex(pred)|null], "fork_strict": [...]}.
"""
import argparse
import json

import fork_modules
import reward_cases as rc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("fork_dir")
    ap.add_argument("out")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--generated", type=int, default=6000)
    ap.add_argument("--soup", type=int, default=0)
    args = ap.parse_args()
    fork = fork_modules.math_dapo(args.fork_dir)
    rng = rc.random.Random(args.seed)
    cases = rc.hand_cases() + rc.generated_cases(rng, args.generated) + rc.soup_cases(rng, args.soup)
    cases = [(r, g) for r, g in cases if rc.b(r).decode("utf-8", "surrogateescape") == r
             and rc.b(g).decode("utf-8", "surrogateescape") == g]
    with open(args.out, "w") as f:
        for resp, gt in cases:
            d = fork.compute_score(resp, gt)
            s = fork.compute_score(resp, gt, strict_box_verify=True)
            f.write(json.dumps({
                "r": rc.b(resp).hex(), "g": rc.b(gt).hex(),
                "fork": [d["score"], int(d["acc"]), rc.hexs(d["pred"])],
                "fork_strict": [s["score"], int(s["acc"]), rc.hexs(s["pred"])],
            }) + "\n")
    print(len(cases))


if __name__ == "__main__":
    main()
