"""Loads the authors' verl fork (complex-reasoning/RPG @ ec8e30bd, provisioned by
scripts/setup.sh; its path is passed in by the C++ test) as oracle modules, unchanged.

The fork's files import `verl.*`; the installed verl is 0.9.1 (no-deps). The shims, kept
here and never in the fork's files:
  - core_algos imports `verl.utils.torch_functional as verl_F`: the fork's own
    torch_functional.py is loaded and bound to that name while core_algos executes, so
    masked_mean & co. are the fork's (the installed module is restored afterwards);
  - math_dapo.py imports nothing of verl and loads as is.
"""
import importlib.util
import os
import sys


def _load(name, path):
    if not os.path.isfile(path):
        raise SystemExit(f"fork oracle: {path} is missing (run scripts/setup.sh)")
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def core_algos(fork_dir):
    import verl.utils  # the parent package must exist before a submodule is swapped in
    fork_tf = _load("rpg_fork_torch_functional", os.path.join(fork_dir, "verl/utils/torch_functional.py"))
    key = "verl.utils.torch_functional"
    saved = sys.modules.get(key)
    saved_attr = getattr(verl.utils, "torch_functional", None)
    sys.modules[key] = fork_tf
    verl.utils.torch_functional = fork_tf
    try:
        module = _load("rpg_fork_core_algos", os.path.join(fork_dir, "verl/trainer/ppo/core_algos.py"))
    finally:
        if saved is not None:
            sys.modules[key] = saved
        else:
            sys.modules.pop(key, None)
        if saved_attr is not None:
            verl.utils.torch_functional = saved_attr
    assert module.verl_F is fork_tf
    return module


def math_dapo(fork_dir):
    return _load("rpg_fork_math_dapo", os.path.join(fork_dir, "verl/utils/reward_score/math_dapo.py"))
