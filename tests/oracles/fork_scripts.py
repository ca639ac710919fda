"""Runs the authors' 60 run scripts (recipe/rpg/7b/*.sh of the fork) with bash and a stub
`ray` first on PATH that records the argv the script submits, so every override is what bash
itself produced (arithmetic, ${VAR:-default}, quoting). Each script runs in a fresh empty
directory with nothing exported but PATH, as from a clean checkout with no Ray settings; that
directory is then written `.` (the fork's checkout) in the values. A script that fails, times
out, submits nothing, submits twice or passes anything but key=value after main_rpg raises.

  argv(path) -> list of the Hydra overrides exactly as bash passed them (in order)
  overrides(path) -> dict of dotted key -> string value (a key given twice must agree)
  compose(fork_dir, overrides) -> the config main_rpg receives: the fork's rpg_trainer.yaml
                      with the overrides applied in order, interpolations resolved (a dict)
  loss_setting(ov) -> the actor-loss fields of one script (defaults from the fork's
                      recipe/rpg/src/config/rpg_trainer.yaml where the script is silent)
"""
import glob
import os
import re
import shutil
import subprocess
import tempfile

# What the scripts hand to `ray job submit ... --`: the fork's trainer entry point.
ENTRY = ["python3", "-m", "recipe.rpg.src.main_rpg"]
_OVERRIDE = re.compile(r"^[+~]{0,2}[A-Za-z_][\w.]*=")

# The stub writes each argument NUL-terminated (an argument may hold newlines, never NUL).
_STUB = """#!{bash}
[ -e "{out}" ] && {{ : > "{out}.twice"; echo "stub ray: submitted twice" >&2; exit 97; }}
for a in "$@"; do printf '%s\\0' "$a"; done > "{out}"
"""


def argv(path, timeout=60):
    bash = shutil.which("bash") or "/bin/bash"
    with tempfile.TemporaryDirectory(prefix="rpg-fork-run-") as tmp:
        stub_dir, cwd, out = os.path.join(tmp, "bin"), os.path.join(tmp, "fork"), os.path.join(tmp, "argv")
        os.mkdir(stub_dir)
        os.mkdir(cwd)
        with open(os.path.join(stub_dir, "ray"), "w") as f:
            f.write(_STUB.format(bash=bash, out=out))
        os.chmod(os.path.join(stub_dir, "ray"), 0o755)
        # Only the stub on PATH: any other command the script ran would fail under its set -e
        # instead of reading this machine.
        try:
            r = subprocess.run([bash, os.path.abspath(path)], cwd=cwd, env={"PATH": stub_dir},
                               stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise ValueError(f"{path}: did not finish within {timeout} s under the stub ray")
        if r.returncode != 0:
            tail = r.stderr.strip().splitlines()[-1:] or [""]
            raise ValueError(f"{path}: exited {r.returncode} under the stub ray: {tail[0]}")
        if not os.path.exists(out):
            raise ValueError(f"{path}: never called ray")
        if os.path.exists(out + ".twice"):
            raise ValueError(f"{path}: called ray more than once")
        args = open(out, encoding="utf-8").read().split("\0")[:-1]
        real = os.path.realpath(cwd)
    if args[:2] != ["job", "submit"] or "--" not in args:
        raise ValueError(f"{path}: ray was called as `ray {' '.join(args[:2])}`, not `ray job submit ... -- cmd`")
    cmd = args[args.index("--") + 1:]
    if cmd[:len(ENTRY)] != ENTRY:
        raise ValueError(f"{path}: submits `{' '.join(cmd[:3])}`, not `{' '.join(ENTRY)}`")
    ov = []
    for a in cmd[len(ENTRY):]:
        if not _OVERRIDE.match(a):
            raise ValueError(f"{path}: `{a}` after main_rpg is not a key=value override")
        ov.append(a.replace(real, ".").replace(cwd, "."))
    if not ov:
        raise ValueError(f"{path}: no main_rpg overrides")
    return ov


def split(arg):
    key, _, value = arg.partition("=")
    return key, value


def overrides(path):
    out = {}
    for a in argv(path):
        key, value = split(a)
        if out.get(key, value) != value:
            raise ValueError(f"{path}: {key} given twice with different values ({out[key]!r}, {value!r})")
        out[key] = value
    return out


_ABSENT = object()


def compose(fork_dir, overrides):
    """What Hydra hands main_rpg (@hydra.main(config_path='config', config_name='rpg_trainer'))
    for these overrides, built with OmegaConf (Hydra's own config library; hydra-core itself
    does not install beside this venv's antlr4). The scripts use two override forms, applied in
    order as Hydra does: `key=value` replaces an existing key (a key the config does not have is
    an error, as in Hydra's struct mode) and `+key=value` adds a new one. Values are parsed as
    YAML, which reads every value the scripts pass (numbers such as 1e-6, True/False, null,
    [a,b] lists, quoted strings) as Hydra's grammar does. Returns the resolved dict."""
    from omegaconf import OmegaConf
    path = os.path.join(fork_dir, "recipe/rpg/src/config/rpg_trainer.yaml")
    if not os.path.isfile(path):
        raise SystemExit(f"fork oracle: {path} is missing (run scripts/setup.sh)")
    cfg = OmegaConf.load(path)
    for a in overrides:
        key, value = split(a)
        if key.startswith("~") or key.startswith("++"):
            raise ValueError(f"override `{a}`: only key=value and +key=value are modelled")
        add = key.startswith("+")
        key = key.lstrip("+")
        exists = OmegaConf.select(cfg, key, default=_ABSENT) is not _ABSENT
        if add and exists:
            raise ValueError(f"override `{a}`: {key} is already in the config (Hydra refuses +key then)")
        if not add and not exists:
            raise ValueError(f"override `{a}`: {key} is not in the fork's config (Hydra: use +{key}=...)")
        parsed = OmegaConf.to_container(OmegaConf.from_dotlist([f"v={value}"]))["v"]
        OmegaConf.update(cfg, key, parsed, force_add=add)
    return OmegaConf.to_container(cfg, resolve=True)


def scripts(fork_dir):
    paths = sorted(glob.glob(os.path.join(fork_dir, "recipe/rpg/7b/*.sh")))
    if len(paths) != 60:
        raise SystemExit(f"fork oracle: expected the 60 run scripts under {fork_dir}/recipe/rpg/7b, got {len(paths)}")
    return paths


_BOOL = {"True": True, "true": True, "False": False, "false": False}

# recipe/rpg/src/config/rpg_trainer.yaml, actor_rollout_ref.actor (the fork's defaults).
ACTOR_DEFAULTS = {
    "clip_ratio": "0.2", "clip_ratio_low": "0.2", "clip_ratio_high": "0.2", "clip_ratio_c": "3.0",
    "loss_agg_mode": "token-mean", "entropy_coeff": "0.001", "use_kl_loss": "False",
    "kl_loss_coef": "0.001", "kl_loss_type": "low_var_kl", "use_iterative_ref_model": "False",
    "use_dynamic_bsz": "False",
}


def loss_setting(ov):
    a = "actor_rollout_ref.actor."
    get = lambda k: ov.get(a + k, ACTOR_DEFAULTS[k])
    return {
        "clip_ratio_low": float(get("clip_ratio_low")),
        "clip_ratio_high": float(get("clip_ratio_high")),
        "clip_ratio_c": float(get("clip_ratio_c")),
        "loss_agg_mode": get("loss_agg_mode"),
        "entropy_coeff": float(get("entropy_coeff")),
        "use_kl_loss": _BOOL[get("use_kl_loss")],
        "kl_loss_coef": float(get("kl_loss_coef")),
        "kl_loss_type": get("kl_loss_type"),
        "use_iterative_ref_model": _BOOL[get("use_iterative_ref_model")],
    }
