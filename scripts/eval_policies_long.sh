#!/usr/bin/env bash
# The policy tables at long contexts (docs/evaluation.md): retrieval accuracy of every policy at
# 1/16, 1/32 and 1/64 of the prompt, with the tokens each actually read per decode step
# (read_tokens, from the policy's selections), at 16384 and 32768 tokens, 50 prompts per task
# (5 depths x 10) of passkey, niah_single and niah_multikey. One JSON line per (task, policy
# variant, budget, length, depth) into OUT, stamped with date, commit and machine, and a
# markdown table per length beside it. Needs ../shared (the Paul Graham essays) and python3.
#   scripts/eval_policies_long.sh [BUILD_DIR]
# Environment:
#   MODEL      the model (default models/kvpred-default.gguf, whose retrieval falls off past its
#              trained 8192 tokens: run it on a model trained for 32K); QKVPP, KVPP, PROFILE
#              (qpredictor's file, the published predictor's, CateKV's head profile r 0.4)
#              default to the files beside it: retrain them for the model first
#   LENGTHS    default "16384 32768"; BUDGETS default 1/16,1/32,1/64
#   TASKS      default "passkey niah_single niah_multikey"; SAMPLES per depth, default 10
#   VARIANTS   space-separated variant names (default all of: full oracle quest quest_c2f
#              qpredictor predictor catekv snapkv pyramidkv h2o streaming)
#   C2F        quest's coarse-to-fine options (default groups=16,coarse=approx,visit=4)
#   EXTRA      flags added to every run (e.g. the sparse prefill's, where it has landed)
#   SEED       default 7; JOBS parallel jobs of one thread, default 2; NICE default 5
#   OUT        default bench/policies_long_MODELNAME.jsonl (replaced)
# Every record gets a `variant` field (quest_c2f is quest with C2F, its policy field says quest)
# and the exact `command`. One `kvpred eval` per task and group of variants that take the same
# flags: full, oracle, quest and qpredictor in one (with qpredictor's --aux), predictor (its own
# --aux), quest_c2f (its --policy-opts) and each evicting variant alone. Within an invocation the
# non-evicting policies share one prefill of each prompt and evaluate only its last 32 to 543
# tokens each, with the answers of their own whole prefills (docs/tasks.md §2.2); the evicting
# ones (catekv, snapkv, pyramidkv, h2o, streaming) prefill every prompt once per budget. So a
# prompt costs 18 prefills instead of 31 (3 shared fills + 15). Cost: a prefill dominates a run (the answer is
# at most 128 tokens); the defaults are 3 tasks x 2 lengths x 50 prompts x 18 prefills of 16K
# and 32K tokens (about 5400), still days on 2 cores; cut VARIANTS, BUDGETS or SAMPLES for a
# first look. One passkey prompt of 8192 tokens with full,oracle,quest,qpredictor x 1/16,1/32,
# 1/64 (10 runs, -t 1, nice 19 on a host busy with other jobs, so only the ratio means much):
# 3.8 and 4.2 s with the shared fill (1.6 s of it the fill), 18.6 and 19.4 s with
# --no-shared-fill, the same answer_fnv in every cell. A check on a tiny run:
#   LENGTHS=512 SAMPLES=1 BUDGETS=1/16 TASKS=passkey OUT=/tmp/p.jsonl scripts/eval_policies_long.sh
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$KVP_ROOT"
kvp="$(realpath "${1:-build}")/kvpred"
kvp_model_files
out="${OUT:-bench/policies_long_${name}.jsonl}"
c2f="${C2F:-groups=16,coarse=approx,visit=4}"
read -r -a lengths <<< "${LENGTHS:-16384 32768}"
read -r -a tasks <<< "${TASKS:-passkey niah_single niah_multikey}"
read -r -a variants <<< "${VARIANTS:-full oracle quest quest_c2f qpredictor predictor catekv snapkv pyramidkv h2o streaming}"
budgets="${BUDGETS:-1/16,1/32,1/64}"
lens="$(printf '%s\n' "${lengths[@]}" | paste -sd, -)"
parts="$(mktemp -d)"
trap 'rm -rf "$parts"' EXIT

# the non-evicting variants that go in one invocation (the same flags): one fill per prompt
shared_group=" full oracle quest qpredictor "

# the flags of a variant, or of a comma-separated group of shared_group's
flags_of() {
    if [[ $1 == *,* ]]; then
        echo "--policy $1$([[ ,$1, == *,qpredictor,* ]] && echo " --aux $qkvpp")"
        return
    fi
    case "$1" in
    full) echo "--policy full" ;;
    oracle) echo "--policy oracle" ;;
    quest) echo "--policy quest" ;;
    quest_c2f) echo "--policy quest --policy-opts $c2f" ;;
    qpredictor) echo "--policy qpredictor --aux $qkvpp" ;;
    predictor) echo "--policy predictor --aux $kvpp" ;;
    catekv) echo "--policy catekv --head-profile $profile" ;;
    snapkv | pyramidkv | h2o | streaming) echo "--policy $1" ;;
    *) echo "unknown variant $1" >&2; return 2 ;;
    esac
}

run_one() { # task variant(s): one eval over every length, depth and budget
    local task="$1" variant="$2" f
    f="$(flags_of "$variant")"
    # shellcheck disable=SC2086
    local cmd=(eval -m "$m" -t 1 --task "$task" --lengths "$lens" --depths 0,25,50,75,100
               --samples "${SAMPLES:-10}" --seed "${SEED:-7}" --budget "$budgets" $f ${EXTRA:-}
               --json)
    nice -n "${NICE:-5}" "$kvp" "${cmd[@]}" 2> "$parts/$task.$variant.txt" |
        python3 -c '
import json, sys
variants, command, prefix = sys.argv[1].split(","), sys.argv[2], sys.argv[3]
out = {v: open("%s.%s.jsonl" % (prefix, v), "w") for v in variants}
for line in sys.stdin:
    r = json.loads(line)
    # a group names its variants by their policies (full, oracle, quest, qpredictor)
    v = variants[0] if len(variants) == 1 else r["policy"]
    r["variant"], r["command"] = v, command
    out[v].write(json.dumps(r) + "\n")' "$variant" "kvpred ${cmd[*]}" "$parts/$task"
}
export -f run_one flags_of
export kvp m qkvpp kvpp profile c2f lens budgets parts SAMPLES SEED EXTRA NICE
group=""
for v in "${variants[@]}"; do
    flags_of "$v" > /dev/null
    [[ $shared_group == *" $v "* ]] && group="${group:+$group,}$v"
done
for task in "${tasks[@]}"; do
    [ -n "$group" ] && echo "$task $group"
    for v in "${variants[@]}"; do
        [[ $shared_group == *" $v "* ]] || echo "$task $v"
    done
done | xargs -P "${JOBS:-2}" -L 1 bash -c 'run_one "$@"' _
cat "$parts"/*.txt >&2
: > "$out"
for task in "${tasks[@]}"; do
    for v in "${variants[@]}"; do
        cat "$parts/$task.$v.jsonl" >> "$out"
    done
done
python3 scripts/bench_tables.py --stamp "$out"

# a table per length: accuracy per (variant, budget) and task over the depths, and the mean
# tokens read per decode step
for len in "${lengths[@]}"; do
    python3 - "$out" "$len" > "${out%.jsonl}_$len.md" <<'EOF'
import json, sys
from collections import OrderedDict
length = int(sys.argv[2])
cells, tasks = OrderedDict(), []
for line in open(sys.argv[1]):
    r = json.loads(line)
    if r["length"] != length:
        continue
    if r["task"] not in tasks:
        tasks.append(r["task"])
    c = cells.setdefault((r["variant"], r["budget"]), {})
    c.setdefault(r["task"], []).append((r["accuracy"], r["samples"], r["read_tokens"]))
print("| variant | budget | " + " | ".join(tasks) + " | tokens read per step |")
print("|---|---|" + "---|" * len(tasks) + "---|")
for (variant, budget), c in cells.items():
    accs, reads = [], []
    for t in tasks:
        v = c.get(t)
        if not v:
            accs.append("–")
            continue
        n = sum(s for _, s, _ in v)
        accs.append("%.1f %% (%d)" % (100.0 * sum(a * s for a, s, _ in v) / n, n))
        reads += [rd for _, _, rd in v]
    print("| %s | %s | %s | %.0f |" % (variant, budget, " | ".join(accs),
                                       sum(reads) / len(reads) if reads else 0))
EOF
    echo "== $len tokens"
    cat "${out%.jsonl}_$len.md"
done
