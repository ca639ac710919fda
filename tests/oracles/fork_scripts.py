"""Reads the authors' 60 run scripts (recipe/rpg/7b/*.sh of the fork) without running them:
shell variable assignments (NAME=value, with ${VAR:-default}, $((arithmetic)) and quotes) and
the Hydra overrides passed to main_rpg (key=value per line). Nothing is guessed: a value that
cannot be resolved raises.

  overrides(path) -> dict of dotted key -> string value, as the trainer received them
  loss_setting(ov) -> the actor-loss fields of one script (defaults from the fork's
                      recipe/rpg/src/config/rpg_trainer.yaml where the script is silent)
"""
import glob
import os
import re

_ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_OVERRIDE = re.compile(r"^\s*\+?([A-Za-z_][\w.]*)=(\S*)\s*\\?\s*$")


def _strip_comment(v):
    out, quote = [], None
    for ch in v:
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#":
            break
        out.append(ch)
    return "".join(out).strip()


def _unquote(v):
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        return v[1:-1]
    return v


def _expand(v, env):
    def arith(m):
        expr = re.sub(r"\$?\b([A-Za-z_]\w*)\b", lambda n: str(env[n.group(1)]), m.group(1))
        if not re.fullmatch(r"[\d\s+\-*/()]+", expr):
            raise ValueError(f"cannot evaluate $(({m.group(1)}))")
        return str(int(eval(expr.replace("/", "//"))))  # shell integer arithmetic

    v = re.sub(r"\$\(\((.*?)\)\)", arith, v)

    def var(m):
        name, default = m.group(1), m.group(3)
        if name in env:
            return env[name]
        if default is not None:
            return _expand(_unquote(default), env)
        raise ValueError(f"unresolved ${{{name}}}")

    v = re.sub(r"\$\{([A-Za-z_]\w*)(:-([^}]*))?\}", var, v)
    v = re.sub(r"\$([A-Za-z_]\w*)", lambda m: env[m.group(1)] if m.group(1) in env else m.group(0), v)
    return v


def overrides(path):
    env, out, in_cmd = {}, {}, False
    for raw in open(path).read().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "main_rpg" in line:
            in_cmd = True
            continue
        if in_cmd:
            m = _OVERRIDE.match(line)
            if m:
                out[m.group(1)] = _unquote(_expand(_unquote(m.group(2)), env))
            continue
        m = _ASSIGN.match(line)
        if m:
            val = _strip_comment(m.group(2))
            try:
                env[m.group(1)] = _expand(_unquote(val), env)
            except (ValueError, KeyError):
                env[m.group(1)] = val  # paths built from unset variables: not used by the loss
    if not out:
        raise ValueError(f"{path}: no main_rpg overrides found")
    return out


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
