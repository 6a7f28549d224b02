#!/usr/bin/env bash
# Writes one llama.cpp vision fixture (testdata/llamacpp/<tower>/) with
# scripts/gen-vision-fixtures.py, against the llama.cpp that
# scripts/build-llamacpp.sh builds (libmtmd included; its `mtmd` target is
# built here when the build lacks it).
#
#   scripts/gen-vision-fixtures.sh TOWER OUT_DIR
#   TOWER: a key of the TOWERS table in gen-vision-fixtures.py (gemma3-vision, qwen3vl-vision, qwen35-vision)
#
# Pins its Python packages as scripts/gen-fixtures.sh does and compiles
# scripts/gen-vision-driver.c against the build's libmtmd and libllama. Not
# run by scripts/test.sh (it needs llama.cpp).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore gguf==0.19.0 numpy==2.4.6
bin="$("$here/build-llamacpp.sh" --bin-dir)"
[ -e "$bin/libmtmd.so" ] || "$here/build-llamacpp.sh"
build="$(readlink -f "$bin/..")"
src="${ONEBIT_LLAMACPP:-$HOME/.cache/onebit/llamacpp}/src"
driver="$bin/../gen-vision-driver"
if [ ! -x "$driver" ] || [ "$here/gen-vision-driver.c" -nt "$driver" ]; then
    cc -O2 -o "$driver" "$here/gen-vision-driver.c" -I"$src/include" -I"$src/ggml/include" -I"$src/tools/mtmd" \
        -L"$bin" -lmtmd -lllama -Wl,-rpath,"$bin"
fi
tower="$1"; out="$2"; shift 2
exec python3 "$here/gen-vision-fixtures.py" "$tower" "$out" --driver "$driver" "$@"
