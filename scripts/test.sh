#!/usr/bin/env bash
# Build and run every test: the release build, its numeric tests under every SIMD table and two
# OpenBLAS kernels, the ASan+UBSan build, and a bounded fuzz run.
#   scripts/test.sh            (FUZZ_SECONDS=N to change the fuzz time per target, 0 to skip;
#                               NUMERIC_MATRIX=0 to skip the tables x kernels runs)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${JOBS:-2}"

echo "== release build and tests"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs" -LE matrix

if [ "${NUMERIC_MATRIX:-1}" != 0 ]; then
    echo "== numeric tests under every SIMD table and two OpenBLAS kernels"
    scripts/test_numeric.sh build
fi

echo "== sanitizer build (ASan + UBSan) and tests"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DKVP_SANITIZE=ON >/dev/null
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE matrix

scripts/test_arm64.sh  # aarch64: cross build, a test subset under qemu-user (docs/platforms.md)

fuzz="${FUZZ_SECONDS:-6}"  # 10 targets: about a minute in all
if [ "$fuzz" -gt 0 ]; then
    echo "== fuzzing the file readers and text paths, ${fuzz}s per target"
    scripts/fuzz.sh "$fuzz"
fi
