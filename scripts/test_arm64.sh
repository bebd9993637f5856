#!/usr/bin/env bash
# Cross-build kvpred for aarch64 (release, in build-arm64/) and run a subset of its tests under
# qemu-user, once with the NEON kernels (KVP_SIMD=neon) and once with the scalar ones.
#
#   scripts/test_arm64.sh          (JOBS=N for the build and ctest; default 2)
#
# Installs nothing: scripts/install-deps.sh adds the cross compiler, the arm64 libraries and
# qemu-user. The test programs run as `qemu-aarch64 PROGRAM` (the toolchain file sets that as
# CMake's emulator and says why without -L), so no binfmt_misc registration is needed; the CLI
# the tests start goes through build-arm64/kvpred-emulated, which does the same.
#
# The subset (docs/platforms.md lists it with its time): the numeric tests of what the NEON
# tables replace or feed (kernels and mat-vec, the quantized dots, KV types and attention, the
# policies' selection and quest's bounds, the predictor's CNN, the prefill GEMM's fallback) and
# the file readers', tokenizer's and sampler's unit tests, which check the aarch64 build's byte
# handling; what needs ../shared skips as usual. test_quant runs its dot tests only
# (KVP_TEST_FILTER); its mat-vec, quantizer and CLI tests, the forward pass, training, the CLI
# end to end and the store take minutes each under emulation and stay in the x86 run.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
jobs="${JOBS:-2}"

for tool in aarch64-linux-gnu-gcc qemu-aarch64; do
    if ! command -v "$tool" >/dev/null; then
        echo "test_arm64: $tool not found; run scripts/install-deps.sh" >&2
        exit 1
    fi
done

# test_attention, test_predictor and test_forward take many minutes each under emulation (with
# the dot-product filter they used to match none of their tests and ran nothing): x86 only
tests=(test_kernels test_quant test_kvcache test_policy_units test_policy_framework
       test_prefill_gemm test_gguf test_tokenizer test_sampler)
regex="^($(IFS='|'; echo "${tests[*]}"))\$"

echo "== aarch64 cross build (build-arm64)"
cmake -S . -B build-arm64 -DCMAKE_BUILD_TYPE=Release \
      -DCMAKE_TOOLCHAIN_FILE=cmake/aarch64-linux-gnu.cmake >/dev/null
targets=()
for t in "${tests[@]}"; do
    targets+=(--target "$t")
done
cmake --build build-arm64 -j"$jobs" "${targets[@]}" --target kvpred_cli

# the filter is test_quant's alone: a program that matches none of a filter fails (an empty
# run would pass while testing nothing)
whole_tests=()
for t in "${tests[@]}"; do [ "$t" = test_quant ] || whole_tests+=("$t"); done
whole="^($(IFS='|'; echo "${whole_tests[*]}"))\$"
for simd in neon scalar; do
    echo "== aarch64 tests under qemu-user, KVP_SIMD=$simd"
    KVP_SIMD="$simd" ctest --test-dir build-arm64 -R "$whole" --output-on-failure -j"$jobs"
    KVP_SIMD="$simd" KVP_TEST_FILTER='test_dot_*' \
        ctest --test-dir build-arm64 -R '^test_quant$' --output-on-failure -j"$jobs"
done
