#!/usr/bin/env bash
# The disk tier on a busy host: the paired ratio (disk `token` time / an untiered twin decoding
# the same tokens in alternating chunks, bench --paired) at 16K and 32K with 0, 1 and 2 CPU-bound
# competitors (scripts/busy_host.sh). Prints one JSON line per run (bench's JSON plus
# "competitors") and then a markdown table (median ratio of REPEAT runs per cell).
#
#   scripts/bench_busy_host.sh [BUILD_DIR]
#   env: MODEL (models/kvpred-default.gguf), N decode tokens (512), REPEAT (3), CTXS
#        ("16384 32768"), COMPETITORS ("0 1 2"), KV_DIR (/tmp)
set -euo pipefail
build=${1:-build}
model=${MODEL:-models/kvpred-default.gguf}
n=${N:-512}
repeat=${REPEAT:-3}
ctxs=${CTXS:-16384 32768}
comps=${COMPETITORS:-0 1 2}
kv_dir=${KV_DIR:-/tmp}
here=$(cd "$(dirname "$0")" && pwd)
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT

for ((r = 0; r < repeat; r++)); do
    for ctx in $ctxs; do
        for c in $comps; do
            "$here/busy_host.sh" "$c" -t 900 -- "$build/kvpred" bench -m "$model" -t 1 -n "$n" \
                -r 1 --prefill 16 -c "$ctx" --policy quest --budget 1/16 --kv-tier disk \
                --kv-dir "$kv_dir" --prefetch token --paired --json 2>/dev/null |
                python3 -c 'import json, sys
d = json.loads(sys.stdin.read()); d["competitors"] = int(sys.argv[1]); print(json.dumps(d))' "$c" |
                tee -a "$lines"
        done
    done
done

python3 - "$lines" "$n" "$repeat" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
ctxs = sorted({r["ctx"] for r in rows})
comps = sorted({r["competitors"] for r in rows})
print()
print("disk `token` ÷ untiered, paired (median of %s runs of %s decode tokens; in brackets: "
      "wait ms per token, requests per token the decode thread submitted itself)"
      % (sys.argv[3], sys.argv[2]))
print("| CPU-bound competitors | " + " | ".join("ctx %d" % c for c in ctxs) + " |")
print("|---|" + "---:|" * len(ctxs))
for k in comps:
    cells = []
    for c in ctxs:
        rs = [r for r in rows if r["ctx"] == c and r["competitors"] == k]
        if not rs:
            cells.append("")
            continue
        ratio = statistics.median(r["paired"]["ratio"] for r in rs)
        wait = statistics.median(r["store"]["wait_ms"] for r in rs)
        direct = statistics.median(r["store"].get("direct_requests", 0) for r in rs)
        cells.append("%.2f× (%.2f ms, %.1f)" % (ratio, wait, direct))
    print("| %d | %s |" % (k, " | ".join(cells)))
EOF
