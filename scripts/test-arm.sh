#!/usr/bin/env bash
# The aarch64 kernels under emulation: cross-builds the kernel tests and the
# golden fixture tests of two families (llama: Q4_K/Q6_K, gemma3: Q5_0) for
# aarch64-unknown-linux-gnu and runs them under qemu-aarch64 (`-cpu max`,
# which has dotprod and i8mm) with each level forced by ONEBIT_ISA (scalar,
# neon, dotprod, i8mm), then the kernel tests once more on an emulated CPU
# without dotprod and i8mm, to show what the tests say about levels a CPU
# cannot run. Installs what it needs (Debian's qemu-user and
# gcc-aarch64-linux-gnu, rustup's aarch64 target) when it is missing.
# Called from scripts/test.sh; needs no stdin.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v qemu-aarch64 >/dev/null || need+=(qemu-user)
command -v aarch64-linux-gnu-gcc >/dev/null || need+=(gcc-aarch64-linux-gnu)
if ((${#need[@]})); then
    sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo -n)
    echo "test-arm: installing ${need[*]}"
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq "${need[@]}" >/dev/null
fi
triple=aarch64-unknown-linux-gnu
rustup target list --installed | grep -qx "$triple" || rustup target add "$triple"

export CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc
runner="qemu-aarch64 -L /usr/aarch64-linux-gnu -cpu"
# Its own target directory: the cross build does not disturb the host's.
cross=(--locked --target "$triple" --target-dir target/aarch64)
kernels=(-p onebit-kernels --lib)
golden=(-p onebit-model --test golden)

echo "test-arm: cross-building the kernel and golden tests for $triple"
CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$runner max" \
    cargo test "${cross[@]}" "${kernels[@]}" "${golden[@]}" --no-run 2>&1 | grep -v '^warning\|^ *[|=]\|^ *-->\|^[0-9 ]*|\|^$' || true

log=$(mktemp)
trap 'rm -f "$log"' EXIT
# Runs the kernel tests with qemu's CPU $1 and ONEBIT_ISA=$2, shows what they
# printed about levels, and checks the quantizers ran at level $3.
kernel_tests() {
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$runner $1" ONEBIT_ISA=$2 \
        cargo test -q "${cross[@]}" "${kernels[@]}" -- quant:: matmul:: f16mm:: attention::full:: pool:: --nocapture >"$log" 2>&1 ||
        { cat "$log"; echo "test-arm: kernel tests failed (qemu cpu $1, ONEBIT_ISA=$2)"; exit 1; }
    grep -E 'levels|SIMD quantizers|ONEBIT_ISA|test result' "$log" | sed 's/^\.*//' | sort -u | sed 's/^/    /'
    if [ "$3" = scalar ]; then
        grep -q "SIMD quantizers not run: the level in use is scalar" "$log"
    else
        grep -q "SIMD quantizers checked at level $3\$" "$log"
    fi || { echo "test-arm: ONEBIT_ISA=$2 did not run level $3"; exit 1; }
}

for isa in scalar neon dotprod i8mm; do
    echo "test-arm: qemu -cpu max, ONEBIT_ISA=$isa: kernel tests"
    kernel_tests max "$isa" "$isa"
    echo "test-arm: qemu -cpu max, ONEBIT_ISA=$isa: golden tests (llama, gemma3)"
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$runner max" ONEBIT_ISA=$isa \
        ONEBIT_GOLDEN_FAMILIES=llama,gemma3 \
        cargo test -q "${cross[@]}" "${golden[@]}" >"$log" 2>&1 ||
        { cat "$log"; echo "test-arm: golden tests failed (ONEBIT_ISA=$isa)"; exit 1; }
    grep -E 'test result' "$log" | sed 's/^/    /'
done

# Cortex-A72 (Armv8.0): NEON only. The tests must say that dotprod and i8mm
# were not run, and the best level must be neon.
echo "test-arm: qemu -cpu cortex-a72 (no dotprod, no i8mm): kernel tests"
kernel_tests cortex-a72 i8mm neon
grep -q "could not run \[dotprod, i8mm\]" "$log" ||
    { echo "test-arm: the tests did not report dotprod and i8mm as not run"; exit 1; }
# The pool's op close under emulation, where a reordered store once let a
# worker run a closed op (a null job): without the close's fences, 7 of 400
# runs of the pool tests aborted under qemu-aarch64 on an x86 host; with
# them, 0 of 800. 100 runs (about 25 s) catch that rate's return most times.
echo "test-arm: qemu -cpu max: the pool's tests 100 times"
pool_bin=$(CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_RUNNER="$runner max" \
    cargo test -q "${cross[@]}" "${kernels[@]}" --no-run --message-format=json 2>/dev/null |
    sed -n 's/.*"executable":"\([^"]*\)".*/\1/p' | head -1)
[ -x "$pool_bin" ] || { echo "test-arm: no kernel test binary to run the pool's tests"; exit 1; }
for i in $(seq 100); do
    $runner max "$pool_bin" -q pool:: >"$log" 2>&1 ||
        { cat "$log"; echo "test-arm: the pool's tests failed on run $i of 100"; exit 1; }
done
echo "test-arm: all aarch64 levels equal the scalar reference; the pool held 100 runs"
