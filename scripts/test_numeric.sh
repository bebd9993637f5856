#!/usr/bin/env bash
# The numeric tests (ctest label `numeric`: forward, attention, kernels, quantization, prefill
# GEMM, policies, predictor, sampler, store equality) once per SIMD table this CPU runs, as the
# built binary reports them (`kvpred --version`), times two OpenBLAS kernels: its own choice and
# a second one (Haswell where the CPU runs AVX2). Every user's machine takes one of these paths;
# the tolerances they are checked against are derived per path (docs/testing.md).
#   scripts/test_numeric.sh [BUILD_DIR]   (default build; BLAS_KERNELS="own SkylakeX ..." to
#                                          choose the kernels, "own" = OPENBLAS_CORETYPE unset)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${1:-$root/build}"
jobs="${JOBS:-2}"

version="$("$build/kvpred" --version)"
tables="$(sed -n 's/^simd: .* this CPU runs \(.*\) (KVP_SIMD chooses)$/\1/p' <<<"$version")"
if [ -z "$tables" ]; then
    echo "test_numeric.sh: no SIMD table list in '$build/kvpred --version'" >&2
    exit 1
fi
kernels="${BLAS_KERNELS:-own}"
if [ -z "${BLAS_KERNELS:-}" ] && [ "$(uname -m)" = x86_64 ] && grep -qw avx2 <<<"$tables"; then
    kernels="own Haswell"
fi
# the pair the plain ctest run has just covered, when the environment forces neither
done_pair=""
if [ -z "${KVP_SIMD:-}" ] && [ -z "${OPENBLAS_CORETYPE:-}" ]; then
    done_pair="$(sed -n 's/^simd: \([a-z0-9]*\) in use.*/\1/p' <<<"$version") own"
fi

for t in $tables; do
    for k in $kernels; do
        if [ "$t $k" = "$done_pair" ]; then
            echo "-- KVP_SIMD=$t, OpenBLAS's own kernel: run above"
            continue
        fi
        echo "-- KVP_SIMD=$t, OPENBLAS_CORETYPE=${k/#own/(unset)}"
        if [ "$k" = own ]; then
            env -u OPENBLAS_CORETYPE KVP_SIMD="$t" \
                ctest --test-dir "$build" -L numeric --output-on-failure -j"$jobs"
        else
            KVP_SIMD="$t" OPENBLAS_CORETYPE="$k" \
                ctest --test-dir "$build" -L numeric --output-on-failure -j"$jobs"
        fi
    done
done
