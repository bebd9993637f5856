#!/usr/bin/env bash
# Retrieval tables and needle heatmaps of the shipped long-context model (README "Long-context
# model"). Needs ../shared (the Paul Graham essays are the filler) and python3 for the tables.
#   scripts/eval_tasks.sh [BUILD_DIR]
# Environment (an 8192-token prompt costs 2-4 CPU seconds and every policy x budget prefills it
# again, so the defaults are sized for a couple of CPU hours; the acceptance figures, 100
# full-cache prompts per task on two seeds, are scripts/eval_acceptance.sh):
#   MODEL      default models/kvpred-default.gguf; AUX (its predictor), PROFILE (its CateKV
#              head profile, r 0.4) default to the files beside it
#   TASKS      default "passkey niah_single niah_multikey" (also niah_multivalue,
#              niah_multiquery, vt)
#   LENGTHS    prompt lengths, one table each, default "2048 4096 8192"
#   SAMPLES    full cache, prompts per depth (5 depths), default 4
#   POLICY_SAMPLES  every other policy, per depth, default 4
#   POLICIES   default full,streaming,h2o,snapkv,pyramidkv,quest,oracle,predictor,catekv
#   HEAT_LENGTHS  heatmap lengths, default 1024,2048,4096,8192 (empty: no heatmaps);
#              HEAT_SAMPLES prompts per cell, default 1
#   SEED       prompt seed, default 7 (evaluation seeds never meet training seeds, see
#              src/cli/cmd_eval_tasks.c); JOBS default 2; OUT default bench
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
kvp="${1:-build}/kvpred"
m="${MODEL:-models/kvpred-default.gguf}"
aux="${AUX:-${m%.gguf}.kvpp}"
profile="${PROFILE:-${m%.gguf}.catekv-r0.4.profile}"
seed="${SEED:-7}"
out="${OUT:-bench}"
name="$(basename "${m%.gguf}")"
read -r -a tasks <<< "${TASKS:-passkey niah_single niah_multikey}"
read -r -a lengths <<< "${LENGTHS:-2048 4096 8192}"
policies="${POLICIES:-full,streaming,h2o,snapkv,pyramidkv,quest,oracle,predictor,catekv}"
heat_lengths="${HEAT_LENGTHS-1024,2048,4096,8192}"
depths=0,25,50,75,100
mkdir -p "$out/heatmaps"

# 1. per length and task: the full cache on 5 depths x SAMPLES prompts, every other policy at
#    budgets 1/16 and 1/8 on 5 depths x POLICY_SAMPLES (the same prompts, the first ones of the
#    seed). Jobs run JOBS at a time, one thread each (a 1M-parameter model gains more from
#    prompts in parallel than from threads inside a prompt), longest first.
run_task() {
    local task="$1" len="$2" pols="$3" budgets="$4" n="$5" dst="$6"
    nice -n "${NICE:-5}" "$kvp" eval -m "$m" -t 1 --task "$task" --lengths "$len" \
        --depths "$depths" --samples "$n" --seed "$seed" --policy "$pols" --budget "$budgets" \
        --aux "$aux" --head-profile "$profile" --json > "$dst" 2> "$dst.txt"
}
export -f run_task
export kvp m depths seed aux profile
parts="$(mktemp -d)"
trap 'rm -rf "$parts"' EXIT
others="$(tr , '\n' <<< "$policies" | grep -vx full | paste -sd, -)"
for len in $(printf '%s\n' "${lengths[@]}" | sort -rn); do
    for task in "${tasks[@]}"; do
        [ -n "$others" ] && echo "$task $len $others 1/16,1/8 ${POLICY_SAMPLES:-4} $parts/${len}_2_$task.jsonl"
        if tr , '\n' <<< "$policies" | grep -qx full; then
            echo "$task $len full 1/8 ${SAMPLES:-4} $parts/${len}_1_$task.jsonl"
        fi
    done
done | xargs -P "${JOBS:-2}" -L 1 bash -c 'run_task "$@"' _
cat "$parts"/*.txt >&2

# 2. the markdown table per length: accuracy per (policy, budget) and task, averaged over depths
table() {
    python3 - "$1" <<'EOF'
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
}
for len in "${lengths[@]}"; do
    tab="$out/tasks_${name}_$len.jsonl"
    cat "$parts/${len}"_1_*.jsonl "$parts/${len}"_2_*.jsonl > "$tab" 2>/dev/null || true
    echo "== $len tokens"
    table "$tab" | tee "$out/tasks_${name}_$len.md"
done

# 3. needle heatmaps (depth x length) for single-needle retrieval, per policy x budget
if [ -n "$heat_lengths" ]; then
    nice -n "${NICE:-5}" "$kvp" eval -m "$m" -t "${JOBS:-2}" --task niah_single \
        --lengths "$heat_lengths" --depths "$depths" --samples "${HEAT_SAMPLES:-1}" \
        --seed "$seed" --policy "$policies" --budget 1/16,1/8 --aux "$aux" \
        --head-profile "$profile" --heatmap "$out/heatmaps" --json > "$out/heatmap_$name.jsonl"
fi
