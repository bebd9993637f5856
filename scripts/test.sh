#!/usr/bin/env bash
# Build and run every test: the release build, the whole suite under every SIMD table with the
# OpenBLAS kernel its CPUs get, the ASan+UBSan build, and a bounded fuzz run.
#   scripts/test.sh            (FUZZ_SECONDS=N to change the fuzz time per target, 0 to skip;
#                               NUMERIC_MATRIX=0 to skip the tables x kernels runs)
# Optional inputs (../shared, the npm packages, Chromium, Redis): under CI=true a missing one
# fails the run with the reason, first here and again in the test that needs it; elsewhere the
# tests that need it skip, and the count of skipped tests and why is printed at the end.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${JOBS:-2}"

shared="${KVP_SHARED_DIR:-$root/../shared}"
missing=()
[ -d "$shared" ] || missing+=("$shared (models, references and texts some tests read)")
command -v redis-server >/dev/null && command -v redis-cli >/dev/null ||
    missing+=("redis-server and redis-cli (scripts/install-deps.sh)")
[ -d tests/node_modules/openai ] && [ -d tests/node_modules/playwright-core ] ||
    missing+=("the npm packages under tests/node_modules (scripts/install-node-deps.sh)")
[ -x "${CHROMIUM:-/usr/bin/chromium}" ] || missing+=("Chromium (scripts/install-deps.sh)")
if [ "${CI:-}" = true ] && [ ${#missing[@]} -gt 0 ]; then
    for m in "${missing[@]}"; do echo "test.sh: missing input: $m" >&2; done
    echo "test.sh: CI=true: every optional input must be present" >&2
    exit 1
fi
# every skipped test (or skipped part of one) appends "program: why" here
export KVP_SKIP_LOG="$root/build/skipped.txt"
mkdir -p build && : >"$KVP_SKIP_LOG"
report_skips() {
    [ -s "$KVP_SKIP_LOG" ] || { echo "== no test skipped"; return; }
    echo "== skipped: $(wc -l <"$KVP_SKIP_LOG") tests or parts of tests (count, program: why):"
    sort "$KVP_SKIP_LOG" | uniq -c | sort -rn
    for m in "${missing[@]}"; do echo "   missing: $m"; done
}
# each step's wall time, printed when it ends and once more at the end (the CI log's budget,
# docs/testing.md "Time")
times=()
step_name="" step_t0=$SECONDS
step() {
    if [ -n "$step_name" ]; then
        times+=("$(printf '%5d s  %s' $((SECONDS - step_t0)) "$step_name")")
        echo "== $step_name: $((SECONDS - step_t0)) s"
    fi
    step_name="$1" step_t0=$SECONDS
    [ -z "$1" ] || echo "== $1"
}
report() {
    step ""
    [ ${#times[@]} -eq 0 ] || { echo "== time per step:"; printf '%s\n' "${times[@]}"; }
    echo "== total: $SECONDS s"
    report_skips
}
trap report EXIT

step "release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" -LE matrix

if [ "${NUMERIC_MATRIX:-1}" != 0 ]; then
    step "the suite under the other SIMD tables, each with its CPUs' OpenBLAS kernel"
    scripts/test_numeric.sh build
fi

step "sanitizer build (ASan + UBSan) and tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVP_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE matrix

step "aarch64: cross build, a test subset under qemu-user"
scripts/test_arm64.sh  # aarch64: cross build, a test subset under qemu-user (docs/platforms.md)

fuzz="${FUZZ_SECONDS:-6}"  # 10 targets: about a minute in all
if [ "$fuzz" -gt 0 ]; then
    step "fuzzing the file readers and text paths, ${fuzz}s per target"
    scripts/fuzz.sh "$fuzz"
fi
