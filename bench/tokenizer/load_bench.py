"""Tokenizer start-up on the real Qwen vocabulary: rpg next to Hugging Face `tokenizers`.

    load_bench.py RPG_BINARY TOKENIZER_DIR [RUNS]

Whole-process wall time, CPU time (user + system) and peak RSS, median of RUNS (default 5),
each run a fresh process:
  rpg         `rpg tokenize --model DIR hi` (program start, load tokenizer.json +
              tokenizer_config.json + chat template, encode, print)
  hf          python -c: import tokenizers, Tokenizer.from_file(tokenizer.json), encode "hi"
and, to split each into start-up and the tokenizer load itself:
  rpg-noop    `rpg --help` (the torch-free `rpg` binary alone: start, print, exit)
  python      python -c "import tokenizers" (the interpreter and the import alone)
  rpg-torch   `rpg --version` (a command that needs libtorch: rpg execs rpg-torch, which
              loads libtorch; what every rpg command paid before the split)
Prints the rpg/hf ratios. On a loaded machine wall time waits for a core; CPU time does not.
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
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024.0  # KiB -> MiB


def main():
    rpg, tok_dir = sys.argv[1], sys.argv[2]
    runs = int(sys.argv[3]) if len(sys.argv) > 3 else 5
    tj = os.path.join(tok_dir, "tokenizer.json")
    cases = {
        "rpg": [rpg, "tokenize", "--model", tok_dir, "hi"],
        "hf": [sys.executable, "-c",
               f"from tokenizers import Tokenizer; t = Tokenizer.from_file({tj!r}); t.encode('hi')"],
        "rpg-noop": [rpg, "--help"],
        "python": [sys.executable, "-c", "import tokenizers"],
        "rpg-torch": [rpg, "--version"],
    }
    res = {}
    for name, argv in cases.items():
        run(argv)  # warm the page cache
        samples = [run(argv) for _ in range(runs)]
        res[name] = tuple(statistics.median(s[k] for s in samples) for k in range(3))
        print(f"{name:10s} wall {res[name][0]:.3f} s  cpu {res[name][1]:.3f} s  peak RSS {res[name][2]:.0f} MiB")
    r, h = res["rpg"], res["hf"]
    print(f"tokenizer load (minus the no-op process): rpg {r[0] - res['rpg-noop'][0]:.3f} s wall, "
          f"{r[1] - res['rpg-noop'][1]:.3f} s cpu, {r[2] - res['rpg-noop'][2]:.0f} MiB;  "
          f"hf {h[0] - res['python'][0]:.3f} s wall, {h[1] - res['python'][1]:.3f} s cpu, "
          f"{h[2] - res['python'][2]:.0f} MiB")
    print(f"whole process rpg/hf: wall {r[0] / h[0]:.2f}x, cpu {r[1] / h[1]:.2f}x, peak RSS {r[2] / h[2]:.2f}x")


if __name__ == "__main__":
    main()
