"""Tokenizer start-up on the real Qwen vocabulary: rpg next to Hugging Face `tokenizers`.

    load_bench.py RPG_BINARY TOKENIZER_DIR [RUNS]

Whole-process wall time and peak RSS (median of RUNS, default 5), each run a fresh process:
  rpg        `rpg tokenize --model DIR hi` (program start, load tokenizer.json +
             tokenizer_config.json, encode, print)
  rpg-noop   `rpg --version` (the program alone: start-up and exit, no tokenizer)
  hf         python -c: import tokenizers, Tokenizer.from_file(tokenizer.json), encode "hi"
  python     python -c "import tokenizers" (the interpreter and the import alone)
so "rpg - rpg-noop" and "hf - python" are the tokenizer loads themselves.
"""
import os
import statistics
import subprocess
import sys
import time


def run(argv):
    t = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(p.pid, 0)
    wall = time.perf_counter() - t
    if status != 0:
        sys.exit(f"{argv} failed with status {status}")
    return wall, usage.ru_maxrss / 1024.0  # KiB -> MiB


def main():
    rpg, tok_dir = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    tj = os.path.join(tok_dir, "tokenizer.json")
    cases = {
        "rpg": [rpg, "tokenize", "--model", tok_dir, "hi"],
        "rpg-noop": [rpg, "--version"],
        "hf": [sys.executable, "-c",
               f"from tokenizers import Tokenizer; t = Tokenizer.from_file({tj!r}); t.encode('hi')"],
        "python": [sys.executable, "-c", "import tokenizers"],
    }
    res = {}
    for name, argv in cases.items():
        run(argv)  # warm the page cache
        samples = [run(argv) for _ in range(runs)]
        res[name] = (statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples))
        print(f"{name:9s} wall {res[name][0]:.3f} s  peak RSS {res[name][1]:.0f} MiB")
    print(f"tokenizer load: rpg {res['rpg'][0] - res['rpg-noop'][0]:.3f} s / "
          f"{res['rpg'][1] - res['rpg-noop'][1]:.0f} MiB;  "
          f"hf {res['hf'][0] - res['python'][0]:.3f} s / {res['hf'][1] - res['python'][1]:.0f} MiB")
    print(f"whole process: rpg/hf wall {res['rpg'][0] / res['hf'][0]:.2f}x, "
          f"RSS {res['rpg'][1] / res['hf'][1]:.2f}x")


if __name__ == "__main__":
    main()
