#!/usr/bin/env bash
# Every path a user's machine may take, after the plain run (which used the table this CPU picks
# and OpenBLAS's own kernel):
#   - the whole release suite once more under every other SIMD table this CPU runs, as the built
#     binary reports them (`kvpred --version`), each with the OpenBLAS kernel the CPUs of that
#     table get: Haswell for `avx2` (an AVX2-only CPU) and `scalar`, OpenBLAS's own choice for
#     the AVX-512 tables. Under Haswell that is every test, as the plain run (`ctest -LE
#     matrix`): the tests labelled `once` reach no SIMD kernel that decides their outcome
#     (docs/testing.md lists them and why) but they do reach OpenBLAS, whose Haswell kernel sums
#     otherwise than its own; under the AVX-512 tables with OpenBLAS's own kernel, which the
#     plain run used, they are left out;
#   - the numeric tests (ctest label `numeric`: forward, attention, kernels, quantization,
#     prefill GEMM, policies, predictor, sampler, store equality) under every table with the
#     other OpenBLAS kernel.
# The tolerances the tests check are derived per path (docs/testing.md), so every pair must pass.
#   scripts/test_numeric.sh [BUILD_DIR]   (default build; BLAS_KERNELS="own SkylakeX ..." to
#                                          choose the kernels, "own" = OPENBLAS_CORETYPE unset;
#                                          WHOLE_SUITE=0: the numeric label only)
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
whole="${WHOLE_SUITE:-1}"

# The OpenBLAS kernel a CPU of table $1 gets: Haswell where the table is what an AVX2-only CPU
# runs (and the portable one, which such a CPU may be asked for), when Haswell is in the list.
native_kernel() {
    case "$1" in
    avx2 | scalar) grep -qw Haswell <<<"$kernels" && echo Haswell || echo own ;;
    *) echo own ;;
    esac
}

for t in $tables; do
    for k in $kernels; do
        if [ "$t $k" = "$done_pair" ]; then
            echo "-- KVP_SIMD=$t, OpenBLAS's own kernel: run above"
            continue
        fi
        # the table's own CPUs' kernel: every test (the whole programs, so the `matrix` entries,
        # which are parts of them, are left out), the `once` ones only where the kernel is not
        # the plain run's; another kernel: `numeric`
        if [ "$k" = "$(native_kernel "$t")" ] && [ "$whole" != 0 ] && [ "$k" != own ]; then
            sel=(-LE matrix)
            what="the whole release suite"
        elif [ "$k" = "$(native_kernel "$t")" ] && [ "$whole" != 0 ]; then
            sel=(-LE 'matrix|once')
            what="the release suite but the once tests"
        else
            sel=(-L numeric)
            what="the numeric tests"
        fi
        echo "-- $what, KVP_SIMD=$t, OPENBLAS_CORETYPE=${k/#own/(unset)}"
        if [ "$k" = own ]; then
            env -u OPENBLAS_CORETYPE KVP_SIMD="$t" \
                ctest --test-dir "$build" "${sel[@]}" --output-on-failure -j"$jobs"
        else
            KVP_SIMD="$t" OPENBLAS_CORETYPE="$k" \
                ctest --test-dir "$build" "${sel[@]}" --output-on-failure -j"$jobs"
        fi
    done
done
