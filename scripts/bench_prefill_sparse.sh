#!/usr/bin/env bash
# Prefill of long real prompts, dense against block-sparse (docs/prefill.md), with llama.cpp's
# llama-bench beside them up to LLAMA_MAX tokens: the SmolLM2-135M shape in Q8_0 (`kvpred synth`,
# random weights; SHAPE names another, e.g. Llama-3.2-1B), the runs of one length in alternation (kvpred dense, kvpred sparse, llama-bench
# without and with flash attention) so all see the same host. The prompt is text (TEXT, repeated
# as needed) tokenized by the model's vocabulary, prefilled for real: no tile fill
# (`kvpred bench --prefill-only`). One JSON line per run on OUT: engine, policy, budget,
# prompt_tokens, prefill_tokens_per_s, seconds, density (keys read / keys seen), estimate_s and
# attention_s (thread-seconds), attention_share (attention thread-seconds over threads x
# seconds), estimate_share (estimate over attention), threads, flash_attn (llama.cpp), rep,
# note, command; date, commit and machine are added at the end (scripts/bench_tables.py
# --stamp). Then a summary per length: sparse over dense, sparse over llama.cpp's best.
#
#   scripts/bench_prefill_sparse.sh [BUILD_DIR]
#
# Environment: LENS ("8192 16384 32768 65536 131072"), DENSE_MAX (131072: dense runs up to this
# length; dense at 131072 takes about an hour on 2 threads), LLAMA_MAX (32768), BUDGET (1/16),
# POLICY (sparse), REPS (1), THREADS (2), OUT (bench/prefill_sparse.jsonl; appended to), NOTE
# ("idle host"), WRAP ("nice -n -20"), SHAPE (SmolLM2-135M: a `kvpred synth --shape` name),
# MODEL (/tmp/kvp-long/smol135m-q8_0.gguf, llama1b-q8_0.gguf for Llama-3.2-1B, SHAPE-q8_0.gguf
# else; made with kvpred synth when missing), TEXT (../shared/data/pg_essays: a file or a folder of .txt files),
# LLAMA_BIN (../shared/peers/llama.cpp/bin; its rows are left out when llama-bench is missing or
# dies), FA ("0 1"), CROSS ("": lengths at which to find the crossover: dense against sparse with
# --prefill-min-keys 1, so every query block past the sink and window is sparse; the default
# min_keys is chosen from these rows).
#
# Quick check: LENS=4096 DENSE_MAX=4096 LLAMA_MAX=4096 OUT=/tmp/p.jsonl scripts/bench_prefill_sparse.sh
# The Llama-3.2-1B shape at 32768 tokens, dense, sparse and llama-bench (about 35 minutes on a
# 2-core host, most of it the dense run):
#   SHAPE=Llama-3.2-1B LENS=32768 scripts/bench_prefill_sparse.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
KVP=$BUILD/kvpred
LENS=${LENS-"8192 16384 32768 65536 131072"}
DENSE_MAX=${DENSE_MAX:-131072}
LLAMA_MAX=${LLAMA_MAX:-32768}
BUDGET=${BUDGET:-1/16}
POLICY=${POLICY:-sparse}
REPS=${REPS:-1}
THREADS=${THREADS:-2}
OUT=${OUT:-bench/prefill_sparse.jsonl}
NOTE=${NOTE:-"idle host"}
WRAP=${WRAP:-"nice -n -20"}
SHAPE=${SHAPE:-SmolLM2-135M}
TEXT=${TEXT:-../shared/data/pg_essays}
LLAMA_BIN=${LLAMA_BIN:-../shared/peers/llama.cpp/bin}
FA=${FA:-"0 1"}
CROSS=${CROSS:-}
# OpenBLAS runs kvpred's prefill attention GEMMs; a pinned core type is not what users have
unset OPENBLAS_CORETYPE

. scripts/lib.sh
MODEL=${MODEL:-$(kvp_synth_file "$SHAPE")}
kvp_need bench_prefill_sparse jq
kvp_need_built bench_prefill_sparse "$KVP"
kvp_synth "$KVP" "$MODEL" "$THREADS" "$SHAPE"
LLAMA=$(kvp_llama_bench bench_prefill_sparse "$LLAMA_BIN" "$MODEL" "$THREADS")
tmp=$(mktemp)
prompt=$(mktemp --suffix=.txt)
trap 'rm -f "$tmp" "$prompt"' EXIT

# The prompt text: TEXT's files one after another, repeated until it holds more tokens than the
# longest length (about 4 bytes a token for English; the model's tokenizer decides).
longest=0
for n in $LENS $CROSS; do [ "$n" -gt "$longest" ] && longest=$n; done
kvp_prompt_text "$TEXT" "$longest" "$prompt" || exit 1

# kvpred_run N POLICY [BUDGET] [EXTRA...]: one prefill of N tokens, one JSON line
kvpred_run() {
    local n=$1 pol=$2 bud=${3:-} rep=$4
    shift 4
    local flags=(--prefill-policy "$pol")
    [ -n "$bud" ] && flags+=(--prefill-budget "$bud")
    flags+=("$@")
    local cmd="kvpred bench -m $MODEL -t $THREADS -r 1 --prefill $n -c $n --prefill-only --fill-text PROMPT ${flags[*]} --json"
    echo "bench_prefill_sparse: kvpred $n ${flags[*]} (rep $rep)" >&2
    $WRAP "$KVP" bench -m "$MODEL" -t "$THREADS" -r 1 --prefill "$n" -c "$n" --prefill-only \
        --fill-text "$prompt" "${flags[@]}" --json 2>/dev/null >"$tmp"
    jq -c --arg cmd "$cmd" --arg note "$NOTE" --argjson rep "$rep" --arg model "synth $SHAPE Q8_0" \
        '{engine: "kvpred", model: $model, policy: .prefill_policy,
          budget: .prefill_budget, prompt_tokens: .prefill_tokens, prefill_tokens_per_s,
          seconds: (.prefill_tokens / .prefill_tokens_per_s), density: .prefill_density,
          density_layers: .prefill_density_layers, estimate_s: .prefill_estimate_s,
          attention_s: .prefill_attention_s,
          attention_share: (.prefill_attention_s / (.threads * .prefill_tokens / .prefill_tokens_per_s)),
          estimate_share: (if .prefill_attention_s > 0 then .prefill_estimate_s / .prefill_attention_s else null end),
          threads, simd, flash_attn: null, rep: $rep, note: $note, command: $cmd}' \
        "$tmp" >>"$OUT"
}

llama_run() {
    local n=$1 fa=$2 rep=$3
    local cmd="llama-bench -m $MODEL -p $n -n 0 -r 1 -t $THREADS -fa $fa -o json"
    echo "bench_prefill_sparse: llama-bench $n fa $fa (rep $rep)" >&2
    LD_LIBRARY_PATH="$LLAMA_BIN" $WRAP "$LLAMA" -m "$MODEL" -p "$n" -n 0 -r 1 \
        -t "$THREADS" -fa "$fa" -o json 2>/dev/null >"$tmp" || return 0
    jq -c --arg cmd "$cmd" --arg note "$NOTE" --argjson rep "$rep" --arg model "synth $SHAPE Q8_0" \
        '.[0] | {engine: "llama-bench", model: $model, policy: "dense",
         prompt_tokens: .n_prompt, prefill_tokens_per_s: .avg_ts,
         seconds: (.n_prompt / .avg_ts), threads: .n_threads, flash_attn: .flash_attn,
         build_commit, rep: $rep, note: $note, command: $cmd}' "$tmp" >>"$OUT"
}

start=$(wc -l <"$OUT" 2>/dev/null || echo 0)
for rep in $(seq "$REPS"); do
    for n in $CROSS; do
        kvpred_run "$n" dense "" "$rep"
        kvpred_run "$n" "$POLICY" "$BUDGET" "$rep" --prefill-min-keys 1
    done
    for n in $LENS; do
        [ "$n" -le "$DENSE_MAX" ] && kvpred_run "$n" dense "" "$rep"
        kvpred_run "$n" "$POLICY" "$BUDGET" "$rep"
        [ -n "$LLAMA" ] && [ "$n" -le "$LLAMA_MAX" ] || continue
        for fa in $FA; do llama_run "$n" "$fa" "$rep"; done
    done
done
python3 scripts/bench_tables.py --stamp "$OUT"
# the summary of this run's rows: per length, the best rate of each engine and policy, and the
# ratios the acceptance asks for
tail -n +"$((start + 1))" "$OUT" | jq -r -s '
    group_by(.prompt_tokens) | .[] |
    (map(select(.engine == "kvpred" and .policy == "dense")) | map(.prefill_tokens_per_s) | max) as $d |
    (map(select(.engine == "kvpred" and .policy != "dense")) | map(.prefill_tokens_per_s) | max) as $s |
    (map(select(.engine == "llama-bench")) | map(.prefill_tokens_per_s) | max) as $l |
    (map(select(.engine == "kvpred" and .policy != "dense")) | map(.attention_share) | max) as $sa |
    (map(select(.engine == "kvpred" and .policy == "dense")) | map(.attention_share) | max) as $da |
    "\(.[0].prompt_tokens) tokens: dense \($d // "-") tok/s (attention \($da // "-")), sparse \($s // "-") tok/s (attention \($sa // "-")), llama.cpp best \($l // "-"); sparse/dense \(if $d and $s then ($s / $d * 100 | round / 100) else "-" end), sparse/llama \(if $l and $s then ($s / $l * 100 | round / 100) else "-" end), sparse seconds \(if $s then (.[0].prompt_tokens / $s | round) else "-" end)"'
