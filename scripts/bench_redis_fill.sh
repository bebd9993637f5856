#!/usr/bin/env bash
# How long filling a long prompt's KV into the Redis tier takes, pipelined and one request per
# round trip, from one binary in one run: starts its own redis-server (and, with CLUSTER=1, a
# 3-master cluster) on free loopback ports in a temporary directory, then for each repetition
# runs `kvpred bench` at CTX tokens with ?pipeline=1 and with the default depth, alternating.
#
# Per run it reports the fill (the prompt's forward pass with the tier under it, fill_seconds)
# and, of that, the time with cold-tier requests in flight (fill_transfer_seconds): the forward
# pass waits for each layer's writes and for the re-reads of the prompt's earlier blocks that
# the next micro-batch attends over, so that is what the tier costs the fill. The ratio of the
# latter between the two depths is what pipelining gives.
#
#   scripts/bench_redis_fill.sh [BUILD_DIR]   env: MODEL (models/kvpred-default.gguf), CTX (32768),
#                                                  REPS (1), CLUSTER (0), OUT (bench_redis_fill.jsonl)
set -euo pipefail
BUILD=${1:-build}
KVP=$BUILD/kvpred
MODEL=${MODEL:-models/kvpred-default.gguf}
CTX=${CTX:-32768}
REPS=${REPS:-1}
CLUSTER=${CLUSTER:-0}
OUT=${OUT:-bench_redis_fill.jsonl}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
kvp_need bench_redis_fill redis-server redis-cli python3

DIR=$(mktemp -d)
PIDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

P=$(kvp_free_port)
kvp_redis_start "$DIR" "$P"
URLS=("redis://127.0.0.1:$P")
if [ "$CLUSTER" = 1 ]; then
    kvp_redis_cluster "$DIR" 3 0
    URLS+=("redis://${NODES[0]},${NODES[1]}")
fi

: > "$OUT"
for url in "${URLS[@]}"; do
    for r in $(seq "$REPS"); do
        for q in "?pipeline=1" ""; do
            "$KVP" bench -m "$MODEL" -t 1 -n 16 -r 1 --prefill 16 -c "$CTX" --policy quest \
                --budget 1/16 --kv-tier redis --kv-url "$url$q" --prefetch token --json |
                jq -c --arg u "$url" --arg d "${q#?pipeline=}" '{url: $u, ctx,
                    pipeline: (if $d == "" then "default" else $d end), fill_seconds,
                    fill_transfer_seconds}' | tee -a "$OUT"
        done
    done
done
jq -rs 'group_by(.url) | .[] |
    (map(select(.pipeline == "1")) | (map(.fill_seconds) | add / length) as $f1 |
        (map(.fill_transfer_seconds) | add / length) | [$f1, .]) as $one |
    (map(select(.pipeline == "default")) | (map(.fill_seconds) | add / length) as $fd |
        (map(.fill_transfer_seconds) | add / length) | [$fd, .]) as $dflt |
    "\(.[0].url) ctx \(.[0].ctx): fill \($one[0] * 1000 | round / 1000) s -> \($dflt[0] * 1000 | round / 1000) s; " +
    "tier share \($one[1] * 1000 | round / 1000) s -> \($dflt[1] * 1000 | round / 1000) s (\($one[1] / $dflt[1] * 10 | round / 10)x)"' "$OUT"
