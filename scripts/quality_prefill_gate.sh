#!/usr/bin/env bash
# The learned estimate of block-sparse prefill against pooled at equal budgets (docs/prefill.md,
# "The learned estimate"), on the default model: train the gate (kvpred train-prefill-gate, its
# per-layer validation recovery next to pooled's), then for each budget of BUDGETS the next-token
# KL and perplexity of held-out text after a sparse prefill with each estimate (the reference
# dense), and retrieval accuracy (eval --task) after each. JSON lines on OUT, stamped.
#
#   scripts/quality_prefill_gate.sh [BUILD_DIR]
#
# Environment: MODEL (models/kvpred-default.gguf), GATE (models/kvpred-default.kvpg; trained
# when TRAIN=1), FILLER (../shared/data/tinystories/tinystories_val.txt: training haystacks),
# PROMPTS (16) VAL (4) LENGTH (4096): the training prompts, BUDGETS ("1/8 1/16"), KL_PREFILL
# (4096), KL_DECODE (128), OFFSETS ("0": byte offsets into the held-out text, one KL row
# each), MIN_KEYS (1024: query blocks seeing fewer keys read them all), WINDOW (64), TASKS
# ("passkey niah_single"; empty: none), TASK_LENGTH (4096), SAMPLES (2 per depth, depths
# 0,25,50,75,100: 10 prompts), THREADS (2), OUT (bench/prefill_gate.jsonl; appended to).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
KVP=$BUILD/kvpred
MODEL=${MODEL:-models/kvpred-default.gguf}
GATE=${GATE:-models/kvpred-default.kvpg}
TRAIN=${TRAIN:-0}
FILLER=${FILLER:-../shared/data/tinystories/tinystories_val.txt}
PROMPTS=${PROMPTS:-16}
VAL=${VAL:-4}
LENGTH=${LENGTH:-4096}
BUDGETS=${BUDGETS:-"1/8 1/16"}
KL_PREFILL=${KL_PREFILL:-4096}
KL_DECODE=${KL_DECODE:-128}
OFFSETS=${OFFSETS:-0}
MIN_KEYS=${MIN_KEYS:-1024}
WINDOW=${WINDOW:-64}
TASKS=${TASKS-"passkey niah_single"}
TASK_LENGTH=${TASK_LENGTH:-4096}
SAMPLES=${SAMPLES:-2}
THREADS=${THREADS:-2}
OUT=${OUT:-bench/prefill_gate.jsonl}
TEXT=data/heldout_stories.txt
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
kvp_need quality_prefill_gate jq
kvp_need_built quality_prefill_gate "$KVP"
start=$(wc -l <"$OUT" 2>/dev/null || echo 0)

if [ "$TRAIN" = 1 ]; then
    cmd="kvpred train-prefill-gate -m $MODEL -t $THREADS -f $FILLER --prompts $PROMPTS --val $VAL --length $LENGTH --window $WINDOW --min-keys $MIN_KEYS -o $GATE --json"
    echo "quality_prefill_gate: training $GATE" >&2
    "$KVP" train-prefill-gate -m "$MODEL" -t "$THREADS" -f "$FILLER" --prompts "$PROMPTS" \
        --val "$VAL" --length "$LENGTH" --window "$WINDOW" --min-keys "$MIN_KEYS" -o "$GATE" \
        --json | jq -c --arg cmd "$cmd" '. + {kind: "train", command: $cmd}' >>"$OUT"
fi

est_flags() { # the --prefill-* flags of estimate $1 at budget $2
    local f=(--prefill-policy "$1" --prefill-budget "$2" --prefill-min-keys "$MIN_KEYS"
             --prefill-window "$WINDOW")
    [ "$1" = learned ] && f+=(--prefill-predictor "$GATE")
    echo "${f[@]}"
}

for b in $BUDGETS; do
    for est in pooled learned; do
        read -r -a flags <<<"$(est_flags "$est" "$b")"
        for off in $OFFSETS; do
            cmd="kvpred eval -m $MODEL -t $THREADS -f $TEXT --offset $off --prefill $KL_PREFILL --decode $KL_DECODE --policy full ${flags[*]} --json"
            echo "quality_prefill_gate: KL, $est at $b, offset $off" >&2
            "$KVP" eval -m "$MODEL" -t "$THREADS" -f "$TEXT" --offset "$off" \
                --prefill "$KL_PREFILL" --decode "$KL_DECODE" --policy full "${flags[@]}" \
                --json 2>/dev/null | grep '^{' |
                jq -c --arg est "$est" --arg cmd "$cmd" '. + {kind: "kl", estimate: $est, command: $cmd}' >>"$OUT"
        done
        for task in $TASKS; do
            cmd="kvpred eval -m $MODEL -t $THREADS --task $task --lengths $TASK_LENGTH --depths 0,25,50,75,100 --samples $SAMPLES --policy full ${flags[*]} --json"
            echo "quality_prefill_gate: $task, $est at $b" >&2
            "$KVP" eval -m "$MODEL" -t "$THREADS" --task "$task" --lengths "$TASK_LENGTH" \
                --depths 0,25,50,75,100 --samples "$SAMPLES" --policy full "${flags[@]}" \
                --json 2>/dev/null | grep '^{' |
                jq -c --arg est "$est" --arg cmd "$cmd" '. + {kind: "task", estimate: $est, command: $cmd}' >>"$OUT"
        done
    done
done
python3 scripts/bench_tables.py --stamp "$OUT"
tail -n +"$((start + 1))" "$OUT" | jq -r '
    if .kind == "train" then "trained: recovery learned \(.recovery_learned) pooled \(.recovery_pooled)"
    elif .kind == "kl" then "KL \(.estimate) budget \(.prefill_budget) offset \(.offset) density \(.prefill_density * 1000 | round / 1000): KL \(.kl), ppl ratio \(.ppl_ratio), estimate/attention \(.prefill_estimate_s / .prefill_attention_s * 1000 | round / 10) %"
    else "\(.task) \(.estimate) budget \(.prefill_budget) density \(.prefill_density * 1000 | round / 1000): accuracy \(.accuracy) over \(.samples)" end'
