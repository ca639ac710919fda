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
_OVERRIDE = re.compile(r"^\s*(\+?[A-Za-z_][\w.]*)=(\S*)\s*\\?\s*$")


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


def _matching(s, i, open_, close):
    """Index of the `close` that balances the `open_` at s[i]."""
    depth = 0
    for k in range(i, len(s)):
        if s.startswith(open_, k):
            depth += 1
        elif s.startswith(close, k):
            depth -= 1
            if depth == 0:
                return k
    raise ValueError(f"unbalanced {open_} in {s!r}")


def _expand(v, env):
    """Shell word expansion of the forms the scripts use, with quote removal."""
    out, i, quoted = [], 0, False
    while i < len(v):
        ch = v[i]
        if ch == "'" and not quoted:
            end = v.index("'", i + 1)
            out.append(v[i + 1:end])
            i = end + 1
        elif ch == '"':
            quoted = not quoted
            i += 1
        elif v.startswith("$((", i):
            end = _matching(v, i + 1, "(", ")")
            expr = _expand(v[i + 3:end - 1], env)
            expr = re.sub(r"\b([A-Za-z_]\w*)\b", lambda n: str(env[n.group(1)]), expr)
            if not re.fullmatch(r"[\d\s+\-*/()]+", expr):
                raise ValueError(f"cannot evaluate $(({expr}))")
            out.append(str(int(eval(expr.replace("/", "//")))))  # shell integer arithmetic
            i = end + 1
        elif v.startswith("${", i):
            end = _matching(v, i + 1, "{", "}")
            body = v[i + 2:end]
            name, sep, default = body.partition(":-")
            if name in env:
                out.append(env[name])
            elif sep:
                out.append(_expand(default, env))
            else:
                raise ValueError(f"unresolved ${{{name}}}")
            i = end + 1
        elif ch == "$" and i + 1 < len(v) and (v[i + 1].isalpha() or v[i + 1] == "_"):
            m = re.match(r"[A-Za-z_]\w*", v[i + 1:])
            if m.group(0) not in env:
                raise ValueError(f"unresolved ${m.group(0)}")
            out.append(env[m.group(0)])
            i += 1 + len(m.group(0))
        else:
            out.append(ch)
            i += 1
    return "".join(out)


def overrides(path):
    # The scripts run from the fork's checkout with nothing exported: $PWD is that directory.
    env, out, in_cmd = {"PWD": "."}, {}, False
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
                out[m.group(1)] = _expand(m.group(2), env)
            continue
        m = _ASSIGN.match(line)
        if m:
            val = _strip_comment(m.group(2))
            env[m.group(1)] = _expand(val, env)
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
