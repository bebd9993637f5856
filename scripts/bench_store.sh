#!/usr/bin/env bash
# Tiered KV store benchmark (docs/store.md, "Measuring").
#
# For each context (default 4096 16384 32768) and a policy budget of 1/16 of the context, decode
# tokens/s of: RAM dense (untiered, dense attention), RAM sparse (untiered, the policy), disk
# dense (the whole cache refetched from an O_DIRECT file every step), and disk sparse with
# --prefetch none, layer and token. One JSON line per run goes to $OUT, then a markdown table
# is printed. A timeline PNG of the disk/token run is written per context. The disk/token run is
# paired with an untiered twin (bench --paired), and its ratio to it is the table's last row.
#
#   scripts/bench_store.sh [BUILD_DIR]      env: MODEL, POLICY (quest), CTXS, N (decode tokens),
#                                                PAIRED_N (decode tokens of the paired disk token
#                                                run, default 4 N: 4 times as many alternating
#                                                chunks, so its ratio moves less with the host),
#                                                KV_DIR (/tmp), THREADS (1), OUT, AUX (predictor
#                                                file, for POLICY=predictor), DISK_FLAGS (more
#                                                flags for the tiered runs, e.g. --hot-budget N,
#                                                or --kv-syscall-submit: disk reads submitted by
#                                                syscall instead of a polling kernel thread)
# The disk tier's file is unnamed (O_TMPFILE) and read with O_DIRECT, so every read is a cold
# read from the device, never the page cache.
set -euo pipefail
BUILD=${1:-build}
KVP=$BUILD/kvpred
MODEL=${MODEL:-../shared/models/stories260K.gguf}
POLICY=${POLICY:-quest}
CTXS=${CTXS:-"4096 16384 32768"}
N=${N:-64}
PAIRED_N=${PAIRED_N:-$((4 * N))}
KV_DIR=${KV_DIR:-/tmp}
THREADS=${THREADS:-1}
OUT=${OUT:-bench_store.jsonl}
AUXF=()
[ -n "${AUX:-}" ] && AUXF=(--aux "$AUX")
: > "$OUT"

run() { # label, flags... (NTOK: decode tokens, default N)
    local label=$1; shift
    "$KVP" bench -m "$MODEL" -t "$THREADS" -n "${NTOK:-$N}" -r 1 --prefill 16 --json "$@" 2>/dev/null |
        jq -c --arg l "$label" '. + {"label": $l}' >> "$OUT"
    tail -n 1 "$OUT" | jq -r '"\(.label) ctx \(.ctx): \(.decode_tokens_per_s | floor) tokens/s"' >&2
}

for c in $CTXS; do
    pol=(--policy "$POLICY" --budget 1/16 "${AUXF[@]}")
    run "RAM dense" -c "$c"
    run "RAM sparse" -c "$c" "${pol[@]}"
    disk=(--kv-tier disk --kv-dir "$KV_DIR")
    # shellcheck disable=SC2206
    [ -n "${DISK_FLAGS:-}" ] && disk+=($DISK_FLAGS)
    run "disk dense" -c "$c" "${disk[@]}" --prefetch dense
    run "disk none" -c "$c" "${pol[@]}" "${disk[@]}" --prefetch none
    run "disk layer" -c "$c" "${pol[@]}" "${disk[@]}" --prefetch layer
    # --paired: an untiered twin decodes the same tokens in alternating chunks, so the ratio
    # to RAM sparse comes from the same seconds of a shared host (the rows above do not)
    NTOK=$PAIRED_N run "disk token" -c "$c" "${pol[@]}" "${disk[@]}" --prefetch token --paired \
        --timeline "${TIMELINE_DIR:-bench}/timeline_disk_token_$c.png"
done

echo
echo "decode tokens/s, $POLICY at budget 1/16, $N decode tokens ($PAIRED_N for disk token and its"
echo "paired ratio), $THREADS thread(s)"
jq -rs '
  (map(.ctx) | unique) as $ctxs
  | ["RAM dense","RAM sparse","disk dense","disk none","disk layer","disk token"] as $rows
  | . as $all
  | ("| run | " + ($ctxs | map("ctx \(.)") | join(" | ")) + " |"),
    ("|---|" + ($ctxs | map("---:") | join("|")) + "|"),
    ($rows[] as $r
     | "| \($r) | " + ($ctxs | map(. as $c | ($all[] | select(.label == $r and .ctx == $c)
         | "\(.decode_tokens_per_s * 10 | floor / 10)"
           + (if .store then " (wait \(.store.wait_ms * 100 | floor / 100) ms, hit \(.store.hit_rate * 100 | floor)%)" else "" end)))
         | join(" | ")) + " |"),
    ("| disk token ÷ RAM sparse, paired | " + ($ctxs | map(. as $c | ($all[]
         | select(.label == "disk token" and .ctx == $c)
         | "\(.paired.ratio * 100 | floor / 100)× (RAM sparse \(.paired.ram_tokens_per_s | floor))"))
         | join(" | ")) + " |")
' "$OUT"
