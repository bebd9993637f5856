#!/usr/bin/env bash
# Several questions on one document (`kvpred eval --task T --questions N`, docs/evaluation.md):
# accuracy per question index for every policy, each follow-up mode, each task, into one JSON
# lines file stamped with date, commit and machine, and a markdown table beside it. Needs
# ../shared (the Paul Graham essays are the niah filler) and python3.
#   scripts/eval_multi_question.sh [BUILD_DIR]
# Environment:
#   MODEL      default models/kvpred-default.gguf; QKVPP (qpredictor's file), KVPP (the
#              published predictor's), PROFILE (CateKV's head profile, r 0.4) default to the
#              files beside it
#   TASKS      default "passkey niah_single niah_multikey"
#   LENGTHS    default 8192 (comma-separated; the document and its longest question fit)
#   DOCS       documents per task and length, default 10; QUESTIONS per document, default 4
#   POLICIES   default "full quest qpredictor snapkv pyramidkv streaming catekv h2o" (space-
#              separated; predictor and oracle also work)
#   BUDGETS    default 1/16 (comma-separated)
#   FOLLOW_UPS default "keep recompute" (recompute: the document prefilled again for every
#              question, what `kvpred serve` does for the policies it keeps no prefix for)
#   SEED       prompt seed, default 7; JOBS parallel jobs (one thread each), default 2
#   OUT        default bench/multi_question_MODELNAME_LENGTHS.jsonl (and .md)
# Cost: the keep mode prefills each document once per policy, recompute once per question: at
# 8192 tokens a prefill of the shipped model takes about 2 CPU seconds, so the defaults are
# 3 x 10 x 8 x (1 + 4) = 1200 prefills, about 45 CPU minutes.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$KVP_ROOT"
kvp="$(realpath "${1:-build}")/kvpred"
kvp_model_files
lengths="${LENGTHS:-8192}"
out="${OUT:-bench/multi_question_${name}_${lengths//,/_}.jsonl}"
read -r -a tasks <<< "${TASKS:-passkey niah_single niah_multikey}"
read -r -a policies <<< "${POLICIES:-full quest qpredictor snapkv pyramidkv streaming catekv h2o}"
read -r -a follow_ups <<< "${FOLLOW_UPS:-keep recompute}"
parts="$(mktemp -d)"
trap 'rm -rf "$parts"' EXIT

# one job per (task, follow-up, policy): each policy needs its own files (--aux differs)
run_one() {
    local task="$1" follow="$2" pol="$3" extra=()
    case "$pol" in
    qpredictor) extra=(--aux "$qkvpp") ;;
    predictor | oracle) extra=(--aux "$kvpp") ;;
    catekv) extra=(--head-profile "$profile") ;;
    esac
    nice -n "${NICE:-5}" "$kvp" eval -m "$m" -t 1 --task "$task" --questions "${QUESTIONS:-4}" \
        --lengths "$lengths" --samples "${DOCS:-10}" --seed "${SEED:-7}" --follow-up "$follow" \
        --policy "$pol" --budget "${BUDGETS:-1/16}" "${extra[@]}" --json \
        > "$parts/$task.$follow.$pol.jsonl" 2> "$parts/$task.$follow.$pol.txt"
}
export -f run_one
export kvp m qkvpp kvpp profile lengths parts QUESTIONS DOCS SEED BUDGETS NICE
for task in "${tasks[@]}"; do
    for follow in "${follow_ups[@]}"; do
        for pol in "${policies[@]}"; do
            echo "$task $follow $pol"
        done
    done
done | xargs -P "${JOBS:-2}" -L 1 bash -c 'run_one "$@"' _
cat "$parts"/*.txt >&2
# in task, follow-up, policy order
: > "$out"
for task in "${tasks[@]}"; do
    for follow in "${follow_ups[@]}"; do
        for pol in "${policies[@]}"; do
            cat "$parts/$task.$follow.$pol.jsonl" >> "$out"
        done
    done
done
python3 scripts/bench_tables.py --stamp "$out"

# the table: accuracy per question index, a row per (task, policy, budget, follow-up)
python3 - "$out" > "${out%.jsonl}.md" <<'EOF'
import json, sys
from collections import OrderedDict
rows = OrderedDict()
nq = 0
for line in open(sys.argv[1]):
    r = json.loads(line)
    key = (r["task"], r["length"], r["policy"], r["budget"], r["follow_up"])
    rows.setdefault(key, {"server": r["server_follow_up"], "docs": r["documents"], "acc": {},
                          "read": []})
    rows[key]["acc"][r["question"]] = r["accuracy"]
    rows[key]["read"].append(r["read_tokens"])
    nq = max(nq, r["questions"])
print("| task | length | policy | budget | follow-up | server does | documents | "
      + " | ".join("q%d" % (q + 1) for q in range(nq)) + " | tokens read |")
print("|---|---|---|---|---|---|---|" + "---|" * nq + "---|")
for (task, length, pol, budget, follow), v in rows.items():
    cells = ["%.0f %%" % (100 * v["acc"][q + 1]) if q + 1 in v["acc"] else "–"
             for q in range(nq)]
    print("| %s | %d | %s | %s | %s | %s | %d | %s | %.0f |" % (
        task, length, pol, budget, follow, v["server"], v["docs"], " | ".join(cells),
        sum(v["read"]) / len(v["read"])))
EOF
cat "${out%.jsonl}.md"
