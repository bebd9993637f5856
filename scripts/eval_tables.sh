#!/usr/bin/env bash
# Regenerate the evaluation tables on stories260K (bench/eval_*.jsonl; needs ../shared).
#   scripts/eval_tables.sh [BUILD_DIR]
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
kvp="${1:-build}/kvpred"
m=../shared/models/stories260K.gguf
t=../shared/data/tinystories/tinystories_val.txt
common=(-m "$m" -f "$t" --prefill 256 --decode 256 --budget 32,64,128)
mkdir -p bench
# every registered policy at the default sink 16 / local 16
"$kvp" eval "${common[@]}" --aux models/stories260K.kvpp --json \
    > bench/eval_stories260K.jsonl 2> bench/eval_stories260K.txt
# the same with sink 4 / local 12, so that budget 32 leaves room to choose
"$kvp" eval "${common[@]}" --sink 4 --local 12 --aux models/stories260K.kvpp \
    --policy streaming,h2o,snapkv,pyramidkv,quest,oracle,oracle_token,random,predictor --json \
    > bench/eval_stories260K_s4l12.jsonl 2> bench/eval_stories260K_s4l12.txt
# catekv: each adaptive mode at r = 0.2 and 0.4 (parameters scaled to a 256-token prompt)
: > bench/eval_catekv.jsonl
for mode in full fraction quest; do
    for r in 0.2 0.4; do
        "$kvp" eval "${common[@]}" --policy catekv --adaptive "$mode" --adaptive-ratio "$r" \
            --sink 8 --local 8 --chunk 8 --tail 8 --window 32 --percentile 0.98 --json \
            2>/dev/null >> bench/eval_catekv.jsonl
    done
done
# catekv + AttentionPredictor: adaptive heads read sink + local + the CNN's best blocks within B
for r in 0.2 0.4; do
    "$kvp" eval "${common[@]}" --policy catekv --adaptive predictor --adaptive-ratio "$r" \
        --aux models/stories260K.kvpp \
        --sink 8 --local 8 --chunk 8 --tail 8 --window 32 --percentile 0.98 --json \
        2>/dev/null >> bench/eval_catekv.jsonl
done
"$kvp" eval "${common[@]}" --policy catekv --head-profile models/stories260K.catekv-r0.4.profile \
    --sink 8 --local 8 --chunk 8 --tail 8 --window 32 --percentile 0.98 --json \
    2>/dev/null >> bench/eval_catekv.jsonl
