# rpg's reward worker: runs a user's verl-style reward function for rpg's Python pool
# (src/rpg/reward/python_pool.cpp, which embeds this file and starts it as
# `python -c <this file> FILE NAME KWARGS_JSON`). Standard library only.
#
# Protocol: JSON lines on fd 3 (a socket shared with rpg), so that the user's prints, on
# stdout or from C extensions, cannot corrupt it (fd 1 is pointed at stderr).
#   worker -> rpg, once:   {"ready": true}  or  {"fatal": "<one line>"}
#   rpg -> worker:         {"items": [{"data_source", "solution_str", "ground_truth", "extra_info"}, ...]}
#   worker -> rpg, one line per item as soon as it is scored, in order:
#                          {"score": x[, "acc": b][, "pred": s][, "extra": {k: v}]}  or  {"error": "<one line>"}
import importlib.util
import json
import math
import os
import sys
import traceback


def one_line(text):
    return " ".join(str(text).split())


def exception_line(exc):
    return one_line(traceback.format_exception_only(type(exc), exc)[-1])


def number(value):
    # bool is an int in Python; verl's reward managers take it as 0 / 1 as well.
    if isinstance(value, (bool, int, float)) and not isinstance(value, complex):
        return float(value)
    return None


def describe(value):
    text = repr(value)
    return f"{type(value).__name__} ({text[:60]}{'...' if len(text) > 60 else ''})"


def convert(result):
    score = number(result)
    if score is not None:
        if not math.isfinite(score):
            return {"error": f"returned {score}, expected a finite number"}
        return {"score": score}
    if not isinstance(result, dict):
        return {"error": f"returned {describe(result)}, expected a number or a dict with a numeric 'score'"}
    if "score" not in result:
        return {"error": f"returned a dict without 'score' (keys: {', '.join(map(str, result))})"}
    score = number(result["score"])
    if score is None or not math.isfinite(score):
        return {"error": f"returned a dict whose 'score' is {describe(result['score'])}, expected a finite number"}
    out = {"score": score}
    extra = {}
    for key, value in result.items():
        if key == "score":
            continue
        if key == "acc" and number(value) is not None:
            out["acc"] = bool(value)
        elif key == "pred" and isinstance(value, str):
            out["pred"] = value
        elif number(value) is not None and math.isfinite(number(value)):
            extra[str(key)] = number(value)
    if extra:
        out["extra"] = extra
    return out


def die_with_rpg():
    # A worker stuck in the user's function must not outlive an rpg that was SIGKILLed
    # (Linux: PR_SET_PDEATHSIG = 1; rpg creates its pools on threads that outlive them).
    try:
        import ctypes
        import signal
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)
    except Exception:  # noqa: BLE001 - not Linux: the worker still ends at end of input
        pass
    if os.getppid() == 1:
        sys.exit(0)


def main():
    path, name, kwargs_text = sys.argv[1], sys.argv[2], sys.argv[3]
    die_with_rpg()
    channel_in = os.fdopen(3, "rb")
    channel_out = os.fdopen(os.dup(3), "wb", buffering=0)
    os.dup2(2, 1)
    sys.stdout = sys.stderr

    def send(message):
        channel_out.write(json.dumps(message, ensure_ascii=True).encode() + b"\n")

    try:
        kwargs = json.loads(kwargs_text)
        sys.path.insert(0, os.path.dirname(os.path.abspath(path)))
        spec = importlib.util.spec_from_file_location("custom_module", path)
        if spec is None or spec.loader is None:
            raise ImportError(f"not a Python file: {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules["custom_module"] = module
        spec.loader.exec_module(module)
    except BaseException as exc:  # noqa: BLE001 - a SystemExit in the user's module is an import failure too
        send({"fatal": f"cannot import it: {exception_line(exc)}"})
        return
    function = getattr(module, name, None)
    if function is None:
        send({"fatal": f"has no function '{name}'"})
        return
    if not callable(function):
        send({"fatal": f"'{name}' is a {type(function).__name__}, not a function"})
        return
    send({"ready": True})

    for line in channel_in:
        if not line.strip():
            continue
        for item in json.loads(line)["items"]:
            try:
                result = function(item["data_source"], item["solution_str"], item["ground_truth"],
                                  item.get("extra_info"), **kwargs)
                reply = convert(result)
            except Exception as exc:  # noqa: BLE001 - reported to rpg, which stops the run
                reply = {"error": f"raised {exception_line(exc)}"}
            send(reply)


if __name__ == "__main__":
    main()
