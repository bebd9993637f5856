#!/usr/bin/env bash
# Decode and prefill of the Phi-3.5-mini and Gemma-2-2B shapes (`kvpred synth`, random weights)
# against llama.cpp's llama-bench on the same files, 2 threads, the two engines alternating so
# both see the same host. One JSON object per measurement on stdout and in OUT/results.jsonl,
# then one summary object (medians per row, kvpred / llama.cpp ratio, date, commit, machine).
#
#   scripts/bench_arch.sh > bench/arch_peers.json           # full shapes, quiet machine
#   LAYERS=2 REPS=1 TG=16 PP=64 TYPES=Q8_0 scripts/bench_arch.sh   # a quick check
#
# Rows: pp (prefill of PP tokens from an empty cache: kvpred bench -c PP --prefill PP,
# llama-bench -p) and tg (decode of TG tokens after one prompt token: kvpred bench -c 1 -n,
# llama-bench -n, which starts from an empty cache). Environment: KVP (default build/kvpred), LLAMA_BIN (default
# ../shared/peers/llama.cpp/bin), OUT (default /tmp/kvp-bench-arch; synth files are kept there
# and reused), SHAPES ("Phi-3.5-mini Gemma-2-2B"), TYPES ("Q8_0 Q4_K"), LAYERS (0: the whole
# shape; llama.cpp recognises Gemma 2 by its 26 layers only, so cut Gemma files do not run
# there), THREADS (2), REPS (3), PP (512), TG (128).
set -euo pipefail

cd "$(dirname "$0")/.."
KVP=${KVP:-build/kvpred}
LLAMA_BIN=${LLAMA_BIN:-../shared/peers/llama.cpp/bin}
OUT=${OUT:-/tmp/kvp-bench-arch}
SHAPES=${SHAPES:-Phi-3.5-mini Gemma-2-2B}
TYPES=${TYPES:-Q8_0 Q4_K}
LAYERS=${LAYERS:-0}
THREADS=${THREADS:-2}
REPS=${REPS:-3}
PP=${PP:-512}
TG=${TG:-128}
export LD_LIBRARY_PATH="$LLAMA_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# OpenBLAS picks its own kernels (see bench_peers.sh)
unset OPENBLAS_CORETYPE

. scripts/lib.sh
kvp_need bench_arch jq "$KVP" "$LLAMA_BIN/llama-bench"
mkdir -p "$OUT"
RES="$OUT/results.jsonl"
: >"$RES"

record() { # engine shape type row tokens_per_s
    jq -nc --arg e "$1" --arg s "$2" --arg ty "$3" --arg row "$4" --argjson v "$5" \
        --argjson t "$THREADS" '{engine:$e, shape:$s, type:$ty, row:$row, threads:$t,
                                 tokens_per_s:$v}' | tee -a "$RES"
}

for shape in $SHAPES; do
    for ty in $TYPES; do
        f="$OUT/$shape-$ty-L$LAYERS.gguf"
        if [ ! -s "$f" ]; then
            layers=()
            [ "$LAYERS" -gt 0 ] && layers=(--layers "$LAYERS")
            "$KVP" synth --shape "$shape" --type "$ty" "${layers[@]}" -t "$THREADS" -o "$f" >&2
        fi
        for rep in $(seq "$REPS"); do
            # bench prefills min(--prefill, -c) tokens: one run per row
            "$KVP" bench -m "$f" -c "$PP" -n 1 --prefill "$PP" -r 1 -t "$THREADS" --json \
                >"$OUT/kvp.json"
            record kvpred "$shape" "$ty" "pp$PP" "$(jq .prefill_tokens_per_s "$OUT/kvp.json")"
            "$KVP" bench -m "$f" -c 1 -n "$TG" --prefill 1 -r 1 -t "$THREADS" --json \
                >"$OUT/kvp.json"
            record kvpred "$shape" "$ty" "tg$TG" "$(jq .decode_tokens_per_s "$OUT/kvp.json")"
            if "$LLAMA_BIN/llama-bench" -m "$f" -p "$PP" -n "$TG" -t "$THREADS" -r 1 -o json \
                >"$OUT/llama.json" 2>"$OUT/llama.err"; then
                record llama.cpp "$shape" "$ty" "pp$PP" \
                    "$(jq '.[] | select(.n_prompt > 0) | .avg_ts' "$OUT/llama.json")"
                record llama.cpp "$shape" "$ty" "tg$TG" \
                    "$(jq '.[] | select(.n_gen > 0) | .avg_ts' "$OUT/llama.json")"
            else
                echo "bench_arch: llama-bench failed on $f (see $OUT/llama.err)" >&2
            fi
        done
    done
done

# medians per (shape, type, row, engine) and the ratio kvpred / llama.cpp
jq -sc --arg date "$(kvp_date)" --arg commit "$(kvp_commit)" --arg machine "$(kvp_machine)" \
    --argjson layers "$LAYERS" --argjson reps "$REPS" '
    def median: sort | if length == 0 then null
                       else (if length % 2 == 1 then .[length / 2 | floor]
                             else (.[length / 2 - 1] + .[length / 2]) / 2 end) end;
    group_by([.shape, .type, .row])
    | map({shape: .[0].shape, type: .[0].type, row: .[0].row, threads: .[0].threads,
           kvpred: ([.[] | select(.engine == "kvpred") | .tokens_per_s] | median),
           llama_cpp: ([.[] | select(.engine == "llama.cpp") | .tokens_per_s] | median)}
          | .ratio = (if .llama_cpp then .kvpred / .llama_cpp else null end))
    | {summary: "bench_arch", date: $date, commit: $commit, machine: $machine, layers: $layers,
       reps: $reps, rows: .}' "$RES"
