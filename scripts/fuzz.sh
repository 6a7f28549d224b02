#!/usr/bin/env bash
# Runs each cargo-fuzz target (fuzz/fuzz_targets) for a fixed time and prints
# a summary line per target: executions, corpus size, crashes.
#
#   scripts/fuzz.sh [seconds per target, default 60] [target ...]
#
# Builds are optimised with debug assertions and overflow checks on (-O -a).
# cargo-fuzz passes nightly-only sanitizer flags; RUSTC_BOOTSTRAP=1 lets the
# stable toolchain take them. Committed seeds (fuzz/corpus/<t>) and past
# crashes (fuzz/regressions/<t>) seed a working corpus in fuzz/target/corpus/<t>
# (not committed). A crash lands in fuzz/artifacts/<t>/: minimise it, commit
# it under fuzz/regressions/<t>/ (crates/onebit/tests/fuzz_regress.rs then
# replays it in CI) and fix the cause.
set -uo pipefail
cd "$(dirname "$0")/.."

secs=${1:-60}
shift || true
targets=("$@")
if [ ${#targets[@]} -eq 0 ]; then
    targets=(gguf safetensors tokenizer chat_template request)
fi
command -v cargo-fuzz >/dev/null || cargo install cargo-fuzz
export RUSTC_BOOTSTRAP=1

cd fuzz
status=0
summary=()
for t in "${targets[@]}"; do
    mkdir -p "target/corpus/$t" "artifacts/$t"
    seeds=("corpus/$t")
    [ -d "regressions/$t" ] && seeds+=("regressions/$t")
    before=$(ls "artifacts/$t" | wc -l)
    log="target/fuzz-$t.log"
    echo "[fuzz] $t for ${secs}s (log: fuzz/$log)"
    cargo fuzz run -O -a "$t" "target/corpus/$t" "${seeds[@]}" -- \
        -max_total_time="$secs" -timeout=20 -rss_limit_mb=2048 -print_final_stats=1 \
        >"$log" 2>&1
    rc=$?
    runs=$(grep -E '^stat::number_of_executed_units' "$log" | awk '{print $2}')
    corpus=$(ls "target/corpus/$t" | wc -l)
    crashes=$(( $(ls "artifacts/$t" | wc -l) - before ))
    line="$t: ${secs}s, ${runs:-?} executions, corpus $corpus, new crashes $crashes, exit $rc"
    echo "[fuzz] $line"
    summary+=("$line")
    if [ "$rc" -ne 0 ]; then
        status=1
        grep -E 'panicked|ERROR|SUMMARY' "$log" | head -5
    fi
done
echo "[fuzz] summary:"
printf '  %s\n' "${summary[@]}"
exit $status
