"""CTest fork_recipes.match_scripts: for each of the authors' 60 run scripts, the recipe in
recipes/fork computes what the script asked for, as rpg reads both.

The script is executed (bash, stub `ray`: tests/oracles/fork_scripts.py) and its own overrides
are given to `rpg config show -`; the recipe is given to `rpg config show`. The two resolved
configs must be equal, paths included (the run directory is written `.` on both sides). And
every override must be placed: a key of the recipe's body that rpg reads, or listed in the
recipe's header under "no effect in rpg" with a key rpg accepts but has no setting for (rpg's
own notice says so where the value is not null). The recipe holds no key the script did not set.

usage: fork_recipes_match.py RPG FORK_DIR RECIPES_DIR
A missing fork, script or recipe fails; nothing is skipped.
"""
import os
import subprocess
import sys

import yaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "oracles"))
import fork_scripts  # noqa: E402

NO_EFFECT_HEAD = "# no effect in rpg"
NOTICE = " has no effect in rpg ("


def show(rpg, args, what):
    r = subprocess.run([rpg, "config", "show", *args], capture_output=True, text=True, timeout=120)
    if r.returncode != 0:
        tail = (r.stderr.strip().splitlines() or [""])[-1]
        raise AssertionError(f"rpg config show {what} exited {r.returncode}: {tail}")
    return yaml.safe_load(r.stdout), r.stderr


def leaves(node, prefix=""):
    """dotted key -> value of every non-mapping value (an empty mapping is a value)."""
    out = {}
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and v:
            out.update(leaves(v, key + "."))
        else:
            out[key] = v
    return out


def header_no_effect(text):
    """The override strings listed in the header under "no effect in rpg", by entry name."""
    entries, name, inside = {}, None, False
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        if line.startswith(NO_EFFECT_HEAD):
            inside = True
        elif inside and line.startswith("#       "):
            if name is None:
                raise AssertionError(f"override listed before any entry name: {line}")
            entries[name].append(line[len("#       "):])
        elif inside and line.startswith("#   ") and not line.startswith("#    "):
            name = line[4:].split(":", 1)[0]
            if not line[4:].split(":", 1)[1].strip():
                raise AssertionError(f"no-effect entry {name} gives no reason")
            entries[name] = []
    return entries


def bare(key):
    return key.lstrip("+~")


def check(rpg, script, recipe):
    argv = fork_scripts.argv(script)
    from_script, script_err = show(rpg, ["-", *argv], f"- <the overrides of {os.path.basename(script)}>")
    from_recipe, recipe_err = show(rpg, [recipe], recipe)
    a, b = leaves(from_script), leaves(from_recipe)
    diff = sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))
    errors = [f"{k}: the script's overrides resolve to {a.get(k, '<absent>')!r}, the recipe to "
              f"{b.get(k, '<absent>')!r}" for k in diff]

    text = open(recipe).read()
    body = leaves(yaml.safe_load(text) or {})
    listed = {arg: name for name, args in header_no_effect(text).items() for arg in args}
    notices = [line.split(NOTICE, 1)[0].split("] ", 1)[-1] for line in script_err.splitlines() if NOTICE in line]
    keys = set()
    for arg in argv:
        key, value = fork_scripts.split(arg)
        key = bare(key)
        keys.add(key)
        in_body, name = key in body, listed.get(arg)
        if in_body and name:
            errors.append(f"{arg}: both a recipe key and listed without effect ({name})")
        elif in_body:
            if key not in a:
                errors.append(f"{arg}: a key of the recipe, but rpg has no setting {key}")
        elif name:
            if key in a or any(k.startswith(key + ".") for k in a):
                errors.append(f"{arg}: listed without effect ({name}), but rpg reads {key}")
            if value not in ("null", "~") and not any(key == n or key.startswith(n + ".") for n in notices):
                errors.append(f"{arg}: listed without effect ({name}), but rpg gives no 'has no effect' notice for it")
        else:
            errors.append(f"{arg}: neither a key of the recipe nor listed without effect")
    errors += [f"recipe key {k}: the script sets no such override" for k in sorted(set(body) - keys)]
    errors += [f"header lists {arg} ({name}): the script passes no such override"
               for arg, name in sorted(listed.items()) if arg not in argv]
    errors += [f"the recipe sets a key without effect: {line.split('] ', 1)[-1]}" for line in recipe_err.splitlines()
               if NOTICE in line]
    return errors


def main():
    if len(sys.argv) != 4:
        raise SystemExit("usage: fork_recipes_match.py RPG FORK_DIR RECIPES_DIR")
    rpg, fork_dir, recipes = sys.argv[1:]
    if not os.access(rpg, os.X_OK):
        raise SystemExit(f"error: no rpg binary at {rpg}")
    if not os.path.isdir(os.path.join(fork_dir, "recipe", "rpg", "7b")):
        raise SystemExit(f"error: the authors' fork is missing at {fork_dir} (run scripts/setup.sh)")
    failed = 0
    scripts = fork_scripts.scripts(fork_dir)
    for script in scripts:
        stem = os.path.basename(script)[:-3]
        recipe = os.path.join(recipes, stem + ".yaml")
        try:
            if not os.path.exists(recipe):
                raise AssertionError(f"no recipe {recipe}")
            errors = check(rpg, script, recipe)
        except (AssertionError, ValueError, subprocess.TimeoutExpired) as e:
            errors = [str(e)]
        for e in errors:
            print(f"error: recipes/fork/{stem}.yaml vs recipe/rpg/7b/{stem}.sh: {e}", file=sys.stderr)
        failed += bool(errors)
    if failed:
        raise SystemExit(f"fork_recipes.match_scripts: {failed} of {len(scripts)} recipes differ from their scripts")
    print(f"fork_recipes.match_scripts: {len(scripts)} recipes resolve as their executed scripts do")


if __name__ == "__main__":
    main()
