#!/usr/bin/env bash
# Every path a user's machine takes, after the plain run (which used the table this CPU picks and
# OpenBLAS's own kernel): the whole release suite once more under every other SIMD table this CPU
# runs, as the built binary reports them (`kvpred --version`), each with the OpenBLAS kernel the
# CPUs of that table get:
#   - `avx2` (an AVX2-only CPU) and `scalar` (which such a CPU may be asked for): OpenBLAS's
#     Haswell kernel, every test (`ctest -LE matrix`, as the plain run): the tests labelled
#     `once` reach no SIMD kernel that decides their outcome (docs/testing.md lists them) but
#     they do reach OpenBLAS, whose Haswell kernel sums otherwise than an AVX-512 CPU's;
#   - the other AVX-512 tables: OpenBLAS's own kernel, which the plain run used, so only the
#     numeric tests (label `numeric`), the ones whose outcome a SIMD table can change.
# BLAS_KERNELS="SkylakeX Zen ..." adds the numeric tests (ctest label `numeric`: forward,
# attention, kernels, quantization, prefill GEMM, policies, predictor, sampler, store equality)
# under every table with each of those kernels, pairs no CPU gets by itself.
# The tolerances the tests check are derived per path (docs/testing.md), so every pair must pass.
#   scripts/test_numeric.sh [BUILD_DIR]   (default build; WHOLE_SUITE=0: the numeric tests only,
#                                          under each table's own kernel)
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
# the kernel OpenBLAS picks here by itself ("blas: OpenBLAS, Cooperlake kernels (...)")
own_kernel="$(sed -n 's/^blas: OpenBLAS, \([A-Za-z0-9]*\) kernels.*/\1/p' <<<"$version")"
# the pair the plain ctest run has just covered, when the environment forces neither
done_pair=""
if [ -z "${KVP_SIMD:-}" ] && [ -z "${OPENBLAS_CORETYPE:-}" ]; then
    done_pair="$(sed -n 's/^simd: \([a-z0-9]*\) in use.*/\1/p' <<<"$version") own"
fi
whole="${WHOLE_SUITE:-1}"

# The OpenBLAS kernel a CPU of table $1 gets ("own": OPENBLAS_CORETYPE unset).
native_kernel() {
    if [ "$(uname -m)" = x86_64 ] && [ "$own_kernel" != Haswell ] &&
        { [ "$1" = avx2 ] || [ "$1" = scalar ]; }; then
        echo Haswell
    else
        echo own
    fi
}

# run WHAT TABLE KERNEL CTEST-SELECTION...
run() {
    local what="$1" t="$2" k="$3" t0=$SECONDS
    shift 3
    echo "-- $what, KVP_SIMD=$t, OPENBLAS_CORETYPE=${k/#own/(unset)}"
    if [ "$k" = own ]; then
        env -u OPENBLAS_CORETYPE KVP_SIMD="$t" \
            ctest --test-dir "$build" "$@" --output-on-failure -j"$jobs"
    else
        KVP_SIMD="$t" OPENBLAS_CORETYPE="$k" \
            ctest --test-dir "$build" "$@" --output-on-failure -j"$jobs"
    fi
    echo "-- KVP_SIMD=$t, OPENBLAS_CORETYPE=${k/#own/(unset)}: $((SECONDS - t0)) s"
}

for t in $tables; do
    k="$(native_kernel "$t")"
    if [ "$t $k" = "$done_pair" ]; then
        echo "-- KVP_SIMD=$t, OpenBLAS's own kernel: run above"
    elif [ "$whole" = 0 ]; then
        run "the numeric tests" "$t" "$k" -L numeric
    elif [ "$k" = own ]; then
        # another AVX-512 table with the kernel the plain run used: only the numeric tests can
        # answer differently there, and CI's time goes to the AVX2-only machines' pairs
        run "the numeric tests" "$t" "$k" -L numeric
    else
        run "the whole release suite" "$t" "$k" -LE matrix
    fi
    for extra in ${BLAS_KERNELS:-}; do
        [ "$extra" = "$k" ] || run "the numeric tests" "$t" "$extra" -L numeric
    done
done
