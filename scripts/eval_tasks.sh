#!/usr/bin/env bash
# Retrieval tables and needle heatmaps of the shipped long-context model (README "Long-context
# model"). Needs ../shared (the Paul Graham essays are the filler) and python3 for the tables.
#   scripts/eval_tasks.sh [BUILD_DIR]
# Environment: MODEL (default models/kvpred-default.gguf), AUX (its predictor), PROFILE (its
# CateKV head profile), SEED (prompt seed, default 7: evaluation seeds never meet training
# seeds, see src/cli/cmd_eval_tasks.c), SAMPLES (full cache, per depth, default 20: 5 depths =
# 100 prompts per task), POLICY_SAMPLES (other policies, per depth, default 10), JOBS (default
# 2), CTX (default: the model's context), OUT (default bench).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
kvp="${1:-build}/kvpred"
m="${MODEL:-models/kvpred-default.gguf}"
aux="${AUX:-${m%.gguf}.kvpp}"
profile="${PROFILE:-${m%.gguf}.catekv-r0.4.profile}"
seed="${SEED:-7}"
samples="${SAMPLES:-20}"
out="${OUT:-bench}"
name="$(basename "${m%.gguf}")"
ctx="$("$kvp" info -m "$m" 2>/dev/null | awk '/context/ {for (i = 1; i <= NF; i++) if ($i ~ /^[0-9]+$/) {print $i; exit}}')"
ctx="${CTX:-${ctx:-2048}}"
mkdir -p "$out/heatmaps"
tasks=(passkey niah_single niah_multikey niah_multivalue niah_multiquery vt)
policies=full,streaming,h2o,snapkv,quest,oracle,predictor,catekv
depths=0,25,50,75,100

# 1. the full cache at the model's context: 100 prompts per task (5 depths x 20), the
#    acceptance numbers; 2. every other policy at budgets 1/16 and 1/8 on fewer prompts (5 depths
#    x POLICY_SAMPLES). Tasks run JOBS at a time, one thread each (a 1M-parameter model gains
#    more from prompts in parallel than from threads inside a prompt).
run_task() {
    local task="$1" pols="$2" budgets="$3" n="$4" dst="$5"
    "$kvp" eval -m "$m" -t 1 --task "$task" --lengths "$ctx" --depths "$depths" \
        --samples "$n" --seed "$seed" --policy "$pols" --budget "$budgets" \
        --aux "$aux" --head-profile "$profile" --json > "$dst" 2> "$dst.txt"
}
export -f run_task
export kvp m ctx depths seed aux profile
parts="$(mktemp -d)"
trap 'rm -rf "$parts"' EXIT
for task in "${tasks[@]}"; do
    echo "$task full 1/8 $samples $parts/1_$task.jsonl"
    echo "$task ${policies#full,} 1/16,1/8 ${POLICY_SAMPLES:-10} $parts/2_$task.jsonl"
done | xargs -P "${JOBS:-2}" -L 1 bash -c 'run_task "$@"' _
tab="$out/tasks_$name.jsonl"
cat "$parts"/1_*.jsonl "$parts"/2_*.jsonl > "$tab"
cat "$parts"/*.txt >&2

# 2. needle heatmaps (depth x length) for single-needle retrieval, per policy x budget
"$kvp" eval -m "$m" -t 2 --task niah_single --lengths 256,512,1024,"$ctx" \
    --depths "$depths" --samples 4 --seed "$seed" --policy "$policies" --budget 1/16,1/8 \
    --aux "$aux" --head-profile "$profile" --heatmap "$out/heatmaps" \
    --json > "$out/heatmap_$name.jsonl"

# 3. the markdown table: accuracy per (policy, budget) and task, averaged over depths
python3 - "$tab" > "$out/tasks_$name.md" <<'EOF'
import json, sys
from collections import defaultdict
acc = defaultdict(list)
order = ["passkey", "niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt"]
tasks, rows = [], []
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["policy"], r["budget"])
    if r["task"] not in tasks:
        tasks.append(r["task"])
        tasks.sort(key=lambda t: order.index(t) if t in order else len(order))
    if key not in rows:
        rows.append(key)
    acc[key, r["task"]].append((r["accuracy"], r["samples"]))
print("| policy | budget | prompts per task | " + " | ".join(tasks) + " |")
print("|---|---|---|" + "---|" * len(tasks))
for key in rows:
    cells = [str(sum(s for _, s in acc.get((key, tasks[0]), [])) if tasks else 0)]
    for t in tasks:
        v = acc.get((key, t))
        if not v:
            cells.append("–")
            continue
        n = sum(s for _, s in v)
        cells.append("%.1f %%" % (100.0 * sum(a * s for a, s in v) / n))
    print("| %s | %s | %s |" % (key[0], key[1], " | ".join(cells)))
EOF
cat "$out/tasks_$name.md"
