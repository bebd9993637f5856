#!/usr/bin/env bash
# Retrieval tables and needle heatmaps of the shipped long-context model (bench/README.md). Needs ../shared (the Paul Graham essays are the filler) and python3 for the tables.
#   scripts/eval_tasks.sh [BUILD_DIR]
# Environment (an 8192-token prompt costs 2-4 CPU seconds and every policy x budget prefills it
# again; the acceptance figures, 100 full-cache prompts per task on two seeds, are
# scripts/eval_acceptance.sh):
#   MODEL      default models/kvpred-default.gguf; AUX (its predictor), PROFILE (its CateKV
#              head profile, r 0.4) default to the files beside it
#   TASKS      default "passkey niah_single niah_multikey" (also niah_multivalue,
#              niah_multiquery, vt)
#   LENGTHS    prompt lengths, one table each, default "2048 4096 8192"
#   POLICY_SAMPLES  prompts per depth (5 depths) for every policy, the full cache included,
#              default 4 (20 prompts per task and length)
#   POLICIES   default full,streaming,h2o,snapkv,pyramidkv,quest,oracle,predictor,catekv
#   HEAT_LENGTHS  extra lengths of the niah_single heatmaps, default 1024 (the heatmaps span
#              these and LENGTHS; niah_single must be in TASKS)
#   SEED       prompt seed, default 7 (evaluation seeds never meet training seeds, see
#              src/cli/cmd_eval_tasks.c); JOBS default 3 (one per task); OUT default bench
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$KVP_ROOT"
kvp="${1:-build}/kvpred"
kvp_model_files
aux="${AUX:-$kvpp}"
seed="${SEED:-7}"
out="${OUT:-bench}"
read -r -a tasks <<< "${TASKS:-passkey niah_single niah_multikey}"
read -r -a lengths <<< "${LENGTHS:-2048 4096 8192}"
policies="${POLICIES:-full,streaming,h2o,snapkv,pyramidkv,quest,oracle,predictor,catekv}"
heat_lengths="$(printf '%s\n' ${HEAT_LENGTHS-1024} "${lengths[@]}" | sort -nu | paste -sd, -)"
depths=0,25,50,75,100
mkdir -p "$out/heatmaps"

# 1. one job per task, one thread each (a 1M-parameter model gains more from prompts in
#    parallel than from threads inside a prompt): every policy at budgets 1/16 and 1/8 on the
#    same 5 depths x POLICY_SAMPLES prompts per length; niah_single also at HEAT_LENGTHS and
#    draws the needle heatmaps (depth x length, one PNG per policy x budget) from that grid.
run_task() {
    local task="$1" lens="$2" dst="$3" heat=()
    [ "$task" = niah_single ] && heat=(--heatmap "$out/heatmaps")
    nice -n "${NICE:-5}" "$kvp" eval -m "$m" -t 1 --task "$task" --lengths "$lens" \
        --depths "$depths" --samples "${POLICY_SAMPLES:-4}" --seed "$seed" --policy "$policies" \
        --budget 1/16,1/8 --aux "$aux" --head-profile "$profile" "${heat[@]}" --json \
        > "$dst" 2> "$dst.txt"
}
export -f run_task
export kvp m depths seed aux profile policies out POLICY_SAMPLES NICE
parts="$(mktemp -d)"
trap 'rm -rf "$parts"' EXIT
lens="$(printf '%s\n' "${lengths[@]}" | paste -sd, -)"
for task in "${tasks[@]}"; do
    if [ "$task" = niah_single ]; then l="$heat_lengths"; else l="$lens"; fi
    echo "$task $l $parts/$task.jsonl"
done | xargs -P "${JOBS:-3}" -L 1 bash -c 'run_task "$@"' _
cat "$parts"/*.txt >&2
cat "$parts"/*.jsonl > "$out/tasks_$name.jsonl"

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
    tab="$parts/tasks_$len.jsonl"
    grep -F "\"length\":$len," "$out/tasks_$name.jsonl" > "$tab" || true
    echo "== $len tokens"
    table "$tab" | tee "$out/tasks_${name}_$len.md"
done
