#!/usr/bin/env bash
# Prefill through the integer GEMM against the dequantize + sgemm path (KVP_PREFILL=sgemm), one
# binary, the two runs alternating so both see the same host. Prints one JSON line per run
# (kvpred bench --json plus "file" and "round"; "prefill_gemm" says which path ran).
#
#   scripts/bench_prefill_gemm.sh FILE.gguf [FILE.gguf ...]
#
# Files: e.g. the synth files scripts/bench_peers.sh makes (OUT/l1b-L4-Q8_0.gguf,
# OUT/smol-L30-Q8_0.gguf). Environment: KVP (default build/kvpred), ROUNDS (3), THREADS ("1 2").
# Each run: `kvpred bench -m FILE -c 512 --prefill 512 -n 16 -t T -r 3 --json`. Like
# bench_peers.sh it unsets a pinned OPENBLAS_CORETYPE (the sgemm path's kernels follow it).
set -euo pipefail
cd "$(dirname "$0")/.."
KVP=${KVP:-build/kvpred}
ROUNDS=${ROUNDS:-3}
THREADS=${THREADS:-1 2}
unset OPENBLAS_CORETYPE
[ $# -gt 0 ] || { echo "usage: $0 FILE.gguf [FILE.gguf ...]" >&2; exit 1; }
for r in $(seq 1 "$ROUNDS"); do
    for f in "$@"; do
        for t in $THREADS; do
            for path in int8 sgemm; do
                KVP_PREFILL=$path "$KVP" bench -m "$f" -c 512 --prefill 512 -n 16 -t "$t" -r 3 \
                    --json | jq -c --arg f "$(basename "$f")" --argjson r "$r" \
                    '{file:$f, round:$r} + .'
            done
        done
    done
done
