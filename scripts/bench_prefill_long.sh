#!/usr/bin/env bash
# Prefill of long prompts: kvpred against llama.cpp's llama-bench on the same random-weight file
# (the SmolLM2-135M shape in Q8_0, `kvpred synth`), the engines in alternation so both see the
# same host. One JSON line per run: engine, prompt_tokens, prefill_tokens_per_s, threads,
# flash_attn (llama.cpp; kvpred's prefill attention is its own), the command; date, commit and
# machine are added at the end (scripts/bench_tables.py --stamp).
#
#   scripts/bench_prefill_long.sh [BUILD_DIR]     about 12 minutes on an idle 2-core host
#
# Environment: LENS ("4096 8192 16384"), REPS (2), THREADS (2), OUT
# (bench/prefill_long.jsonl; appended to), NOTE ("idle host"), WRAP ("nice -n -20"), MODEL
# (/tmp/kvp-long/smol135m-q8_0.gguf, made with kvpred synth when missing), LLAMA_BIN
# (../shared/peers/llama.cpp/bin; its rows are left out when llama-bench is missing or dies),
# FA ("0 1": llama.cpp without and with flash attention, at the longest length only for 1).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
KVP=$BUILD/kvpred
LENS=${LENS:-"4096 8192 16384"}
REPS=${REPS:-2}
THREADS=${THREADS:-2}
OUT=${OUT:-bench/prefill_long.jsonl}
NOTE=${NOTE:-"idle host"}
WRAP=${WRAP:-"nice -n -20"}
MODEL=${MODEL:-/tmp/kvp-long/smol135m-q8_0.gguf}
LLAMA_BIN=${LLAMA_BIN:-../shared/peers/llama.cpp/bin}
FA=${FA:-"0 1"}
# OpenBLAS runs kvpred's prefill attention GEMMs; a pinned core type is not what users have
unset OPENBLAS_CORETYPE

. scripts/lib.sh
kvp_need bench_prefill_long jq
kvp_need_built bench_prefill_long "$KVP"
kvp_synth_smol "$KVP" "$MODEL" "$THREADS"
LLAMA=$(kvp_llama_bench bench_prefill_long "$LLAMA_BIN" "$MODEL" "$THREADS")
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
longest=${LENS##* }

for n in $LENS; do
    for rep in $(seq "$REPS"); do
        cmd="kvpred bench -m $MODEL -t $THREADS -n 1 -r 1 --prefill $n -c $((n + 64)) --json"
        echo "bench_prefill_long: kvpred $n (rep $rep)" >&2
        $WRAP "$KVP" bench -m "$MODEL" -t "$THREADS" -n 1 -r 1 --prefill "$n" -c $((n + 64)) \
            --json 2>/dev/null >"$tmp"
        jq -c --arg cmd "$cmd" --arg note "$NOTE" --argjson rep "$rep" \
            '{engine: "kvpred", model: "synth SmolLM2-135M Q8_0", prompt_tokens: .prefill_tokens,
              prefill_tokens_per_s, threads, simd, flash_attn: null, rep: $rep, note: $note,
              command: $cmd}' "$tmp" >>"$OUT"
        [ -n "$LLAMA" ] || continue
        for fa in $FA; do
            [ "$fa" = 0 ] || [ "$n" = "$longest" ] || continue
            cmd="llama-bench -m $MODEL -p $n -n 0 -r 1 -t $THREADS -fa $fa -o json"
            echo "bench_prefill_long: llama-bench $n fa $fa (rep $rep)" >&2
            LD_LIBRARY_PATH="$LLAMA_BIN" $WRAP "$LLAMA" -m "$MODEL" -p "$n" -n 0 -r 1 \
                -t "$THREADS" -fa "$fa" -o json 2>/dev/null >"$tmp"
            jq -c --arg cmd "$cmd" --arg note "$NOTE" --argjson rep "$rep" \
                '.[0] | {engine: "llama-bench", model: "synth SmolLM2-135M Q8_0",
                 prompt_tokens: .n_prompt, prefill_tokens_per_s: .avg_ts, threads: .n_threads,
                 flash_attn: .flash_attn, build_commit, rep: $rep, note: $note,
                 command: $cmd}' "$tmp" >>"$OUT"
        done
    done
done
python3 scripts/bench_tables.py --stamp "$OUT"
jq -r -s 'group_by([.prompt_tokens, .engine, .flash_attn]) | .[] |
    "\(.[0].prompt_tokens)\t\(.[0].engine)\tfa=\(.[0].flash_attn)\t\(map(.prefill_tokens_per_s * 10 | round / 10))"' \
    "$OUT"
