#!/usr/bin/env bash
# What `kvpred serve --prefix-store` gives a second server: its time to first token on a long
# document another server prefilled, against a cold prefill, also after both servers restart
# with nothing in RAM and no folder; and what the store costs a request it has nothing for (a
# miss: the lookup of every block of the prompt, one pipelined batch).
#
# Starts its own Redis Cluster (3 masters, 3 replicas) on free loopback ports in a temporary
# directory, then two servers A and B on the same model with the same store:
#   cold                  A answers the document (a cold prefill; A stores it)
#   shared                B answers the document plus a question (copied in from the store)
#   shared_after_restart  both restarted; B, then A, answer it with another question
#   miss                  B answers MISSES documents nobody stored; lookup_ms is the store's
#                         lookup of each (its kvpred_prefix_store_lookup_seconds_total), the most
#                         a request waits for the store when it holds nothing
# One JSON line per measurement on stdout and in OUT; ratio is TTFT / the cold TTFT.
#
#   scripts/bench_prefix_store.sh [BUILD_DIR]
#     env: MODEL (models/kvpred-default.gguf), TOKENS (8192), CTX (TOKENS + 512), THREADS (2),
#          MISSES (3), OUT (bench_prefix_store.jsonl)
# The 32K-token case on SmolLM2-135M's shape:
#   build/kvpred synth --shape SmolLM2-135M -o /tmp/smol135m.gguf
#   MODEL=/tmp/smol135m.gguf TOKENS=32768 MISSES=1 scripts/bench_prefix_store.sh
set -euo pipefail
BUILD=${1:-build}
KVP=$BUILD/kvpred
MODEL=${MODEL:-models/kvpred-default.gguf}
TOKENS=${TOKENS:-8192}
CTX=${CTX:-$((TOKENS + 512))}
THREADS=${THREADS:-2}
MISSES=${MISSES:-3}
OUT=${OUT:-bench_prefix_store.jsonl}
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
kvp_need bench_prefix_store redis-server redis-cli curl jq python3 git

DIR=$(mktemp -d)
PIDS=()
SERVERS=()
cleanup() {
    for p in "${SERVERS[@]}" "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$DIR"
}
trap cleanup EXIT

kvp_redis_cluster "$DIR" 3 1
URL="redis://${NODES[0]},${NODES[1]}"

SRV_PORT=
start_server() { # sets SRV_PORT and appends the pid to SERVERS
    local log=$DIR/serve.$RANDOM
    "$KVP" serve -m "$MODEL" -c "$CTX" -t "$THREADS" --port 0 --prefix-store "$URL" \
        --cache-ram 8192 >"$log.out" 2>"$log.err" &
    SERVERS+=($!)
    for _ in $(seq 6000); do
        SRV_PORT=$(awk '/^listening/ {print $2}' "$log.out" 2>/dev/null)
        [ -n "$SRV_PORT" ] && return
        sleep 0.01
    done
    echo "bench_prefix_store: the server did not start: $(cat "$log.err")" >&2
    exit 1
}
stop_servers() {
    for p in "${SERVERS[@]}"; do kill "$p" 2>/dev/null || true; done
    for p in "${SERVERS[@]}"; do wait "$p" 2>/dev/null || true; done
    SERVERS=()
}
metric() { # port name
    curl -s "http://127.0.0.1:$1/metrics" | awk -v n="$2" '$1 == n {print $2}'
}
ask() { # port prompt-file suffix: the answer's JSON
    jq -Rs --arg q "$3" '{prompt: (. + $q), max_tokens: 1}' "$2" |
        curl -s -d @- "http://127.0.0.1:$1/v1/completions"
}
wait_stored() { # port blocks
    for _ in $(seq 6000); do
        local w s
        w=$(metric "$1" kvpred_prefix_store_blocks_written_total)
        s=$(metric "$1" kvpred_prefix_store_blocks_shared_total)
        awk -v w="$w" -v s="$s" -v n="$2" 'BEGIN { exit !(w + s >= n) }' && return
        sleep 0.05
    done
}

COMMIT=$(kvp_commit)
MACHINE=$(kvp_machine)
DATE=$(kvp_date)
COLD=
emit() { # case answer-json [lookup_ms]
    local line
    line=$(jq -c --arg case "$1" --arg model "$(basename "$MODEL")" --arg date "$DATE" \
        --arg commit "$COMMIT" --arg machine "$MACHINE" --argjson threads "$THREADS" \
        --argjson cold "${COLD:-null}" --argjson lookup "${3:-null}" '{bench: "prefix_store",
        case: $case, model: $model, doc_tokens: .usage.prompt_tokens,
        prefix_reused: .kvpred.prefix_reused, ttft_ms: .kvpred.ttft_ms,
        ratio: (if $cold then .kvpred.ttft_ms / $cold else null end), lookup_ms: $lookup,
        threads: $threads, date: $date, commit: $commit, machine: $machine}' <<<"$2")
    echo "$line"
    echo "$line" >>"$OUT"
}

"$KVP" prompt --task passkey -m "$MODEL" --length "$TOKENS" --seed 1 >"$DIR/doc.txt"
start_server; A=$SRV_PORT
start_server; B=$SRV_PORT
R=$(ask "$A" "$DIR/doc.txt" "")
COLD=$(jq .kvpred.ttft_ms <<<"$R")
emit cold "$R"
wait_stored "$A" $(($(jq .usage.prompt_tokens <<<"$R") / 16))
emit shared "$(ask "$B" "$DIR/doc.txt" " What is the pass key?")"
stop_servers
start_server; A=$SRV_PORT
start_server; B=$SRV_PORT
emit shared_after_restart "$(ask "$B" "$DIR/doc.txt" " Where is the pass key?")"
emit shared_after_restart "$(ask "$A" "$DIR/doc.txt" " Which pass key?")"
for i in $(seq "$MISSES"); do
    # passkey documents share their filler: a first line of its own makes each a miss
    { echo "Document $i of $RANDOM."; "$KVP" prompt --task passkey -m "$MODEL" \
        --length "$((TOKENS - 16))" --seed $((100 + i)); } >"$DIR/miss.txt"
    l0=$(metric "$B" kvpred_prefix_store_lookup_seconds_total)
    R=$(ask "$B" "$DIR/miss.txt" "")
    l1=$(metric "$B" kvpred_prefix_store_lookup_seconds_total)
    emit miss "$R" "$(awk -v a="$l0" -v b="$l1" 'BEGIN { printf "%.3f", (b - a) * 1000 }')"
done
stop_servers
