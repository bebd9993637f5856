#!/usr/bin/env bash
# Many long contexts on a small machine: NPL sequences of NPP tokens each (default 16 x 32768 on
# the SmolLM2-135M shape, Q8_0: about 12 GB of f16 KV, 23040 bytes a token) with each sequence's
# cache on the disk tier, quest at 1/16, and a hot tier of HOT tokens per tiered layer, so the KV
# held in RAM stays a fraction of the whole (kv_resident_bytes against kv_cold_bytes in the JSON).
#
# Fill method (FILL, default tile): one sequence prefills 4096 tokens for real, its cache is
# tiled to NPP - 32 tokens with the keys re-rotated to their new positions (kvp_ctx_fill_tile,
# as `kvpred bench --fill tile`) and the last 32 are evaluated for real; its KV is then copied
# into the others (kvp_seq_copy). FILL=copy prefills all NPP tokens for real instead (quadratic:
# most of an hour at 32768 on two cores). Every sequence then decodes NTG tokens of its own
# (different tokens per sequence), all in the same steps; then (--serial) the same sequences
# decode NTG more tokens one after another with the same tier: the rate without batching.
# Last, the dense untiered cache at NPL_DENSE sequences (default: the largest of 16, 8, 4, 2, 1
# whose KV takes at most half of MemAvailable).
#
# ROWS may also name "ram": the disk row's sequences and policy with every cache in RAM (no tier),
# at NPL sequences where their KV fits in three quarters of MemAvailable (else the largest count
# that does, NPL_RAM). Its batched-over-serial ratio is what batching gains when no read waits on
# a device: the ceiling of the disk row's ratio, since the tier adds work to both sides.
#
# Only the decode is timed. LOCK=FILE takes that file's flock for each row's decode only (the
# fill runs before, outside it: kvpred stops itself after the fill, --stop-before-decode), and
# TIMED_NICE=N renices every thread of kvpred to N for that part, e.g. on a shared host:
#
#   LOCK=/work/coord/bench.lock TIMED_NICE=-20 nice -n 19 scripts/bench_batched_disk.sh
#   scripts/bench_batched_disk.sh        # on an idle host with ~13 GB free under KV_DIR
#
# Writes bench/batched_disk_<UTC date>.jsonl (one JSON line per row, with date, commit,
# machine, the command, the fill method and NOTE) and prints the rows.
#
# Environment: KVP (build/kvpred), OUT (synth file, /tmp/kvp-bench-batched), KV_DIR (scratch
# files of the disk tier, default $TMPDIR or /tmp), NPL (16), NPP (32768), NTG (16), T (2), HOT
# (hot-tier tokens per tiered layer, 5120: with the 2 dense layers resident, about 1/5 of the
# KV in RAM), FILL (tile), NPL_DENSE (see above; 0 skips the dense row), NPL_RAM (see "ram"),
# ROWS ("disk dense"; add "ram" for the RAM ceiling row), DISK_FLAGS (more flags of the disk row,
# e.g. --kv-syscall-submit: sixteen rings' polling threads on two cores), LOCK, TIMED_NICE, NOTE
# (free text stored with each row, e.g. the host's load).
set -euo pipefail

cd "$(dirname "$0")/.."
. scripts/lib.sh
KVP=${KVP:-build/kvpred}
OUT=${OUT:-/tmp/kvp-bench-batched}
KV_DIR=${KV_DIR:-${TMPDIR:-/tmp}}
NPL=${NPL:-16}
NPP=${NPP:-32768}
NTG=${NTG:-16}
T=${T:-2}
HOT=${HOT:-5120}
FILL=${FILL:-tile}
LOCK=${LOCK:-}
TIMED_NICE=${TIMED_NICE:-}
NOTE=${NOTE:-}
ROWS=${ROWS:-disk dense}
DISK_FLAGS=${DISK_FLAGS:-}
KV_TOKEN_BYTES=23040 # f16 K and V: 30 layers x 3 KV heads x 64 x 2 x 2 bytes
# largest_fitting MAX NUM DEN: the largest of MAX, 16, 8, 4, 2, 1 (at most MAX) whose sequences'
# KV takes at most NUM/DEN of MemAvailable, or 0
largest_fitting() {
    local avail n
    avail=$(awk '/MemAvailable/ {printf "%d", $2 / 1024}' /proc/meminfo)
    for n in "$1" 16 8 4 2 1; do
        if [ "$n" -le "$1" ] &&
            [ $((n * (NPP + 2 * NTG) * KV_TOKEN_BYTES / 1048576)) -le $((avail * $2 / $3)) ]; then
            echo "$n"
            return
        fi
    done
    echo 0
}
NPL_DENSE=${NPL_DENSE:-$(largest_fitting 16 1 2)}
NPL_RAM=${NPL_RAM:-$(largest_fitting "$NPL" 3 4)}
RES=bench/batched_disk_$(date -u +%Y%m%dT%H%M%SZ).jsonl
COMMIT=$(kvp_commit)
MACHINE=$(kvp_machine)
mkdir -p "$OUT" bench
f="$OUT/smol-L30-Q8_0.gguf"
[ -s "$f" ] || "$KVP" synth --shape SmolLM2-135M --layers 30 --type Q8_0 -t 2 -o "$f"

# timed PID: once kvpred has stopped itself after the fill, take LOCK, renice its threads to
# TIMED_NICE, let it run to its end
timed() {
    local pid=$1 st
    while st=$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) && [ "$st" != T ] &&
        [ "$st" != Z ]; do
        sleep 1
    done
    [ "$st" = T ] || return 0 # exited (an error) before stopping
    local go="
        if [ -n '$TIMED_NICE' ]; then
            for t in /proc/$pid/task/*; do renice -n '$TIMED_NICE' -p \"\${t##*/}\" >/dev/null; done
        fi
        kill -CONT $pid
        while kill -0 $pid 2>/dev/null && [ \"\$(awk '{print \$3}' /proc/$pid/stat)\" != Z ]; do
            sleep 0.2
        done"
    if [ -n "$LOCK" ]; then flock "$LOCK" bash -c "$go"; else bash -c "$go"; fi
}

# run NAME ARGS...: one batched-bench row, tagged
run() {
    local name=$1
    shift
    echo "bench_batched_disk: $KVP batched-bench $*" >&2
    local row
    row=$(mktemp "$OUT/disk_row.XXXXXX")
    "$KVP" batched-bench -m "$f" -t "$T" --json --stop-before-decode "$@" >"$row" &
    local pid=$!
    timed "$pid"
    wait "$pid"
    jq -c --arg n "$name" --arg d "$(kvp_date)" --arg c "$COMMIT" --arg m "$MACHINE" \
        --arg cmd "kvpred batched-bench -m $f -t $T --json $*" --arg note "$NOTE" \
        --arg fm "one sequence filled ($FILL: $([ "$FILL" = tile ] &&
            echo "4096 tokens prefilled, tiled to npp - 32, the last 32 prefilled" ||
            echo "all npp tokens prefilled")), its KV copied into the others" \
        '{row:$n, date:$d, commit:$c, machine:$m, command:$cmd, fill_method:$fm, note:$note} + .' \
        "$row" | tee -a "$RES"
    rm -f "$row"
}

[[ " $ROWS " != *" disk "* ]] ||
    run "disk tier, quest 1/16" -npp "$NPP" -ntg "$NTG" -npl "$NPL" \
    --policy quest --budget 1/16 --kv-tier disk --kv-dir "$KV_DIR" --hot-budget "$HOT" \
    --fill "$FILL" --serial $DISK_FLAGS
if [ "$NPL_RAM" -gt 0 ] && [[ " $ROWS " == *" ram "* ]]; then
    run "untiered, quest 1/16 (RAM ceiling)" -npp "$NPP" -ntg "$NTG" -npl "$NPL_RAM" \
        --policy quest --budget 1/16 --fill "$FILL" --serial
fi
if [ "$NPL_DENSE" -gt 0 ] && [[ " $ROWS " == *" dense "* ]]; then
    run "dense, untiered" -npp "$NPP" -ntg "$NTG" -npl "$NPL_DENSE" --fill "$FILL" --serial
fi
echo "bench_batched_disk: $RES" >&2
