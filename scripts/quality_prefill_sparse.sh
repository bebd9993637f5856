#!/usr/bin/env bash
# What block-sparse prefill costs in quality (docs/prefill.md), on the default model: retrieval
# accuracy (`kvpred eval --task`) after a dense and after a sparse prefill, each decoded with the
# full cache and with quest at QUEST_BUDGET; then the next-token KL and perplexity of held-out
# text after a sparse prefill against the dense reference (`kvpred eval -f`), at each sparse
# budget of SWEEP so a user can pick a density. JSON lines on OUT (eval's own records, each with
# its prefill_* fields, plus "prefill_arm"); a summary per task, length and decode policy:
# accuracy dense, sparse, and the difference in points.
#
#   scripts/quality_prefill_sparse.sh [BUILD_DIR]
#
# Environment: MODEL (models/kvpred-default.gguf), TASKS ("passkey niah_single niah_multikey"),
# LENGTHS ("2048 4096 8192"), DEPTHS ("0,25,50,75,100"), SAMPLES (10 per depth: 50 prompts per
# task and length), SPARSE ("--prefill-policy sparse": the settings under test), QUEST_BUDGET
# (1/16), SWEEP ("1/4 1/8 1/16 1/32": prefill budgets of the KL rows), KL_PREFILL (8192),
# KL_DECODE (256), TEXT (data/heldout_stories.txt), THREADS (2), OUT
# (bench/prefill_sparse_quality.jsonl; appended to).
#
# Quick check: SAMPLES=1 DEPTHS=50 LENGTHS=8192 SWEEP=1/16 OUT=/tmp/q.jsonl scripts/quality_prefill_sparse.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
KVP=$BUILD/kvpred
MODEL=${MODEL:-models/kvpred-default.gguf}
TASKS=${TASKS:-"passkey niah_single niah_multikey"}
LENGTHS=${LENGTHS:-"2048 4096 8192"}
DEPTHS=${DEPTHS:-"0,25,50,75,100"}
SAMPLES=${SAMPLES:-10}
SPARSE=${SPARSE:-"--prefill-policy sparse"}
QUEST_BUDGET=${QUEST_BUDGET:-1/16}
SWEEP=${SWEEP:-"1/4 1/8 1/16 1/32"}
KL_PREFILL=${KL_PREFILL:-8192}
KL_DECODE=${KL_DECODE:-256}
TEXT=${TEXT:-data/heldout_stories.txt}
THREADS=${THREADS:-2}
OUT=${OUT:-bench/prefill_sparse_quality.jsonl}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
kvp_need quality_prefill_sparse jq
kvp_need_built quality_prefill_sparse "$KVP"
start=$(wc -l <"$OUT" 2>/dev/null || echo 0)

# one length per call, so that each record's prefill_density is its length's
for task in $TASKS; do
  for lens in $LENGTHS; do
    for arm in dense sparse; do
        flags=()
        [ "$arm" = sparse ] && read -r -a flags <<<"$SPARSE"
        cmd="kvpred eval -m $MODEL -t $THREADS --task $task --lengths $lens --depths $DEPTHS --samples $SAMPLES --policy full,quest --budget $QUEST_BUDGET ${flags[*]} --json"
        echo "quality_prefill_sparse: $task at $lens, $arm prefill" >&2
        "$KVP" eval -m "$MODEL" -t "$THREADS" --task "$task" --lengths "$lens" --depths "$DEPTHS" \
            --samples "$SAMPLES" --policy full,quest --budget "$QUEST_BUDGET" "${flags[@]}" \
            --json 2>/dev/null |
            grep '^{' | jq -c --arg arm "$arm" --arg cmd "$cmd" '. + {prefill_arm: $arm, command: $cmd}' >>"$OUT"
    done
  done
done
# KL and perplexity after a sparse prefill (the reference is always dense), budget swept
for b in $SWEEP; do
    cmd="kvpred eval -m $MODEL -t $THREADS -f $TEXT --prefill $KL_PREFILL --decode $KL_DECODE --policy full ${SPARSE} --prefill-budget $b --json"
    echo "quality_prefill_sparse: KL at prefill budget $b" >&2
    # shellcheck disable=SC2086
    "$KVP" eval -m "$MODEL" -t "$THREADS" -f "$TEXT" --prefill "$KL_PREFILL" --decode "$KL_DECODE" \
        --policy full $SPARSE --prefill-budget "$b" --json 2>/dev/null |
        grep '^{' | jq -c --arg cmd "$cmd" '. + {prefill_arm: "sparse", command: $cmd}' >>"$OUT"
done
python3 scripts/bench_tables.py --stamp "$OUT"
tail -n +"$((start + 1))" "$OUT" | jq -r -s '
    map(select(.task)) | group_by([.task, .length, .policy]) | .[] |
    (map(select(.prefill_arm == "dense")) | (map(.accuracy * .samples) | add) / (map(.samples) | add)) as $d |
    (map(select(.prefill_arm == "sparse")) | (map(.accuracy * .samples) | add) / (map(.samples) | add)) as $s |
    (map(select(.prefill_arm == "sparse")) | .[0].prefill_density) as $dens |
    "\(.[0].task) \(.[0].length) \(.[0].policy) \(.[0].budget): dense \($d * 1000 | round / 10) %, sparse \($s * 1000 | round / 10) % (density \($dens * 1000 | round / 1000)), \(($s - $d) * 1000 | round / 10) points"'
tail -n +"$((start + 1))" "$OUT" | jq -r -s '
    map(select(.task | not)) | .[] |
    "KL rows: prefill budget \(.prefill_budget), density \(.prefill_density * 1000 | round / 1000): KL \(.kl_mean // .kl), ppl ratio \(.ppl_ratio * 10000 | round / 10000)"'
