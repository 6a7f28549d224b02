#!/usr/bin/env bash
# Writes one llama.cpp golden-logits fixture (testdata/llamacpp/<family>/)
# with scripts/gen-fixtures.py, against the llama.cpp that
# scripts/build-llamacpp.sh builds (built here if missing, ~20 minutes).
#
#   scripts/gen-fixtures.sh FAMILY OUT_DIR                  write a fixture
#   scripts/gen-fixtures.sh FAMILY OUT_DIR --compare DIR    ... and compare it with DIR
#   FAMILY: a key of the FAMILIES table in gen-fixtures.py (llama, qwen2, qwen3,
#   gemma3, lfm2, hunyuan-dense, phi3, qwen35, nanbeige, gemma4, gemma4-nople, gemma4-moe, gemma4-a4b, qwen3moe, qwen3moe-q5k, lfm2moe, qwen35moe, gpt-oss,
#   qwen3vl, qwen3vlmoe,
#   gemma-embedding)
#
# Pins its Python packages (gguf-py as vendored in that llama.cpp, NumPy for
# the seeded weights) and compiles scripts/gen-fixtures-driver.c against the
# build's libllama. Not run by scripts/test.sh (it needs llama.cpp).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore gguf==0.19.0 numpy==2.4.6
bin="$("$here/build-llamacpp.sh" --bin-dir)"
[ -x "$bin/llama-quantize" ] || "$here/build-llamacpp.sh"
src="${ONEBIT_LLAMACPP:-$HOME/.cache/onebit/llamacpp}/src"
driver="$bin/../gen-fixtures-driver"
if [ ! -x "$driver" ] || [ "$here/gen-fixtures-driver.c" -nt "$driver" ]; then
    cc -O2 -o "$driver" "$here/gen-fixtures-driver.c" -I"$src/include" -I"$src/ggml/include" \
        -L"$bin" -lllama -Wl,-rpath,"$bin"
fi
family="$1"; out="$2"; shift 2
exec python3 "$here/gen-fixtures.py" "$family" "$out" --bin-dir "$bin" --driver "$driver" "$@"
