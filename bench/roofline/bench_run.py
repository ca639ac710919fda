"""What scaling.py and scaling_long.py share: their sweep's arguments, and one roofline_bench
child process (its JSON measurement lines by phase and its own peak RSS, wait4)."""
import argparse
import json
import os
import subprocess
import sys
import tempfile


def run_bench(argv):
    """(measurements: list of dicts, peak RSS in MiB); exits naming the command when it fails."""
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        child = subprocess.Popen(argv, stdout=out, stderr=err, text=True)
        _, status, usage = os.wait4(child.pid, 0)  # this child's own peak RSS
        code = os.waitstatus_to_exitcode(status)
        out.seek(0), err.seek(0)
        stdout, stderr = out.read(), err.read()
    if code:
        sys.exit(f"{os.path.basename(sys.argv[0])}: {' '.join(argv)} exited {code}: {stderr[-2000:]}")
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")], usage.ru_maxrss / 1024


def sweep_arguments(lengths, batches, base_length):
    """The arguments of a sweep over response lengths (at --base-batch) and batches (at --base-length)."""
    repo = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--bench", default=os.path.join(repo, "build", "bench", "roofline", "roofline_bench"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--lengths", default=lengths)
    ap.add_argument("--batches", default=batches)
    ap.add_argument("--base-batch", type=int, default=8, help="the batch of the length sweep")
    ap.add_argument("--base-length", type=int, default=base_length, help="the response length of the batch sweep")
    ap.add_argument("--prompt-len", type=int, default=64)
    return ap
