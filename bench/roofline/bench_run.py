"""One roofline_bench child process: its JSON measurement lines by phase and its own peak RSS
(wait4), for scaling.py and scaling_long.py."""
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
