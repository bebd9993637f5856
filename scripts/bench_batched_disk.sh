#!/usr/bin/env bash
# Many long contexts on a small machine: NPL sequences of NPP tokens each (default 16 x 32768 on
# the SmolLM2-135M shape, Q8_0: about 12 GB of f16 KV) with each sequence's cache on the disk
# tier, quest at 1/16, and a hot tier of HOT tokens per layer, so the KV held in RAM stays a
# fraction of the whole (kv_resident_bytes against kv_cold_bytes in the JSON). Fill method:
# one sequence prefills NPP tokens, its KV is copied into the others (kvpred batched-bench
# --fill copy, kvp_seq_copy), then every sequence decodes NTG tokens of its own (different
# tokens per sequence), all in the same steps; then (--serial) the same sequences decode NTG
# more tokens one after another with the same tier: the rate without batching. Last, the dense
# untiered cache at NPL_DENSE sequences (the largest count whose KV fits the machine's RAM).
#
#   scripts/bench_batched_disk.sh        # on an idle host with ~20 GB free under KV_DIR
#
# Writes bench/batched_disk_<UTC date>.jsonl (one JSON line per row, with date, commit,
# machine, the command and the fill method) and prints the rows.
#
# Environment: KVP (build/kvpred), OUT (synth file, /tmp/kvp-bench-batched), KV_DIR (scratch
# files of the disk tier, default $TMPDIR or /tmp), NPL (16), NPP (32768), NTG (32), T (2),
# HOT (hot-tier tokens per layer, 5120: 320 blocks against quest's 128 per KV head), NPL_DENSE
# (4; 0 skips the dense row).
set -euo pipefail

cd "$(dirname "$0")/.."
KVP=${KVP:-build/kvpred}
OUT=${OUT:-/tmp/kvp-bench-batched}
KV_DIR=${KV_DIR:-${TMPDIR:-/tmp}}
NPL=${NPL:-16}
NPP=${NPP:-32768}
NTG=${NTG:-32}
T=${T:-2}
HOT=${HOT:-5120}
NPL_DENSE=${NPL_DENSE:-4}
RES=bench/batched_disk_$(date -u +%Y%m%dT%H%M%SZ).jsonl
COMMIT=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
MACHINE="$(uname -n) $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ *//') $(nproc) cores $(awk '/MemTotal/ {printf "%.0f GiB", $2 / 1048576}' /proc/meminfo)"
mkdir -p "$OUT" bench
f="$OUT/smol-L30-Q8_0.gguf"
[ -s "$f" ] || "$KVP" synth --shape SmolLM2-135M --layers 30 --type Q8_0 -t 2 -o "$f"

# run NAME ARGS...: one batched-bench row, tagged
run() {
    local name=$1
    shift
    echo "bench_batched_disk: $KVP batched-bench $*" >&2
    "$KVP" batched-bench -m "$f" -t "$T" --json "$@" |
        jq -c --arg n "$name" --arg d "$(date -u +%FT%TZ)" --arg c "$COMMIT" --arg m "$MACHINE" \
            --arg cmd "kvpred batched-bench $*" \
            '{row:$n, date:$d, commit:$c, machine:$m, command:$cmd} + .' | tee -a "$RES"
}

run "disk tier, quest 1/16, filled by copy" -npp "$NPP" -ntg "$NTG" -npl "$NPL" \
    --policy quest --budget 1/16 --kv-tier disk --kv-dir "$KV_DIR" --hot-budget "$HOT" \
    --fill copy --serial
if [ "$NPL_DENSE" -gt 0 ]; then
    run "dense, untiered, filled by copy" -npp "$NPP" -ntg "$NTG" -npl "$NPL_DENSE" --fill copy \
        --serial
fi
echo "bench_batched_disk: $RES" >&2
