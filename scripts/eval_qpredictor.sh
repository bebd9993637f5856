#!/usr/bin/env bash
# The query-aware AttentionPredictor's results (bench/README.md, docs/policies.md), beside quest,
# the block oracle and the paper-faithful predictor.
# Needs ../shared (the Paul Graham essays are the filler, stories260K and TinyStories) and jq.
#   scripts/eval_qpredictor.sh [BUILD_DIR]
# Environment: PART (tasks, stories, bench or all; default all), SEED (prompt seed of the
# retrieval part, default 7, the acceptance set: tune on others), SAMPLES (prompts per depth,
# default 10: 5 depths = 50 per task), LENGTH (prompt tokens of the retrieval part, default 8192,
# the shipped model's trained context), TASKS (default "niah_single niah_multikey passkey"),
# BASELINES (the policies run beside qpredictor, default "quest,oracle,predictor"; empty: none),
# MODEL (default models/kvpred-default.gguf), KVPP and QKVPP (the predictor files, default the
# model's .kvpp and .qkvpp beside it), CTXS (bench
# contexts, default "16384 32768"), OUT (default bench). Every line of the JSON outputs is one
# kvpred command's result.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$KVP_ROOT"
kvp="${1:-build}/kvpred"
part="${PART:-all}"
seed="${SEED:-7}"
samples="${SAMPLES:-10}"
out="${OUT:-bench}"
kvp_model_files
length="${LENGTH:-8192}"
baselines="${BASELINES-quest,oracle,predictor}"
mkdir -p "$out"

# 1. retrieval on the shipped model at LENGTH tokens, budgets 1/16 and 1/8: quest, the block
#    oracle and the paper's predictor read KVPP, qpredictor QKVPP (one --aux per run, so two runs
#    on the same prompts)
if [[ "$part" == all || "$part" == tasks ]]; then
    dst="$out/qpredictor_tasks_${length}_seed$seed.jsonl"
    : > "$dst"
    for task in ${TASKS:-niah_single niah_multikey passkey}; do
        common=(-m "$m" -t 1 --task "$task" --lengths "$length" --depths 0,25,50,75,100
                --samples "$samples" --seed "$seed" --budget 1/16,1/8 --json)
        if [[ -n "$baselines" ]]; then
            "$kvp" eval "${common[@]}" --policy "$baselines" --aux "$kvpp" >> "$dst"
        fi
        "$kvp" eval "${common[@]}" --policy qpredictor --aux "$qkvpp" >> "$dst"
    done
    echo "retrieval at $length, seed $seed, $((samples * 5)) prompts per task (mean accuracy over depths):"
    jq -rs 'group_by([.task, .policy, .budget]) | .[] |
            "\(.[0].task)\t\(.[0].policy)\t\(.[0].budget)\t\((map(.accuracy * .samples) | add) /
             (map(.samples) | add) * 1000 | round / 10) %"' "$dst"
fi

# 2. stories260K on held-out text: the last 40 KB of tinystories_val.txt (the predictors were
#    trained on bytes [0.5, 0.947) of it), prefill 256, decode 256, budgets 64 and 128
if [[ "$part" == all || "$part" == stories ]]; then
    txt=../shared/data/tinystories/tinystories_val.txt
    off=$(( $(stat -c %s "$txt") - 40960 ))
    dst="$out/qpredictor_stories260K.jsonl"
    common=(-m ../shared/models/stories260K.gguf -f "$txt" --offset "$off" --prefill 256
            --decode 256 --budget 64,128 --json)
    "$kvp" eval "${common[@]}" --policy streaming,h2o,quest,oracle,predictor \
        --aux models/stories260K.kvpp > "$dst"
    "$kvp" eval "${common[@]}" --policy qpredictor --aux models/stories260K.qkvpp >> "$dst"
    echo "stories260K, held-out text from byte $off: attention recovery"
    jq -r '"\(.policy)\t\(.budget)\t\(.recovery * 10000 | round / 10000)"' "$dst"
fi

# 3. policy time per token on the shipped model, 1 thread, budget 1/16, quest and the two
#    predictors in one run of this script (alternating per context)
if [[ "$part" == all || "$part" == bench ]]; then
    dst="$out/qpredictor_bench.jsonl"
    : > "$dst"
    for c in ${CTXS:-16384 32768}; do
        for pol in quest:$kvpp qpredictor:$qkvpp predictor:$kvpp; do
            "$kvp" bench -m "$m" -t 1 -c "$c" -n 64 --prefill 16 --policy "${pol%%:*}" \
                --budget 1/16 --aux "${pol#*:}" --json 2>/dev/null >> "$dst"
        done
    done
    echo "policy time (1 thread, budget 1/16): ctx, policy, ms per token, share; CPU ms, share"
    jq -r '"\(.ctx)\t\(.policy)\t\(.policy_ms_per_token * 1000 | round / 1000)\t\(.policy_share * 1000 | round / 1000)\t\(.policy_cpu_ms_per_token * 1000 | round / 1000)\t\(.policy_cpu_share * 1000 | round / 1000)"' "$dst"
fi
