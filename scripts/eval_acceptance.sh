#!/usr/bin/env bash
# Full-cache retrieval acceptance of a long-context model (models/kvpred-default.md): pass key
# (noise lines), pass key hidden in prose the trainer never sees (the Paul Graham essays, refused
# by train-lm), niah_single and niah_multikey, 100 prompts per (task, length) = 5 depths x 20,
# for each evaluation seed. Needs ../shared (the essays). Prints one markdown row per
# (seed, length) and writes the JSON lines to OUT/acceptance_NAME.jsonl.
#   scripts/eval_acceptance.sh [BUILD_DIR]
# Environment: MODEL (default models/kvpred-default.gguf), SEEDS (default "4242 777"), LENGTHS
# (default "2048 8192"), SAMPLES (per depth, default 20), JOBS (default 2), OUT (default bench).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$KVP_ROOT"
kvp="${1:-build}/kvpred"
kvp_model_files
out="${OUT:-bench}"
essays="${KVP_SHARED_DIR:-../shared}/data/pg_essays"
[ -d "$essays" ] || { echo "eval_acceptance: $essays not found (needs ../shared)" >&2; exit 1; }
mkdir -p "$out"
dst="$out/acceptance_$name.jsonl"
parts="$(mktemp -d)"
trap 'rm -rf "$parts"' EXIT
for seed in ${SEEDS:-4242 777}; do
    for len in ${LENGTHS:-2048 8192}; do
        for task in passkey passkey_prose niah_single niah_multikey; do
            echo "$seed $len $task"
        done
    done
done | xargs -P "${JOBS:-2}" -L 1 bash -c '
    seed=$1 len=$2 task=$3 extra=()
    [ "$task" = passkey_prose ] && extra=(--filler "'"$essays"'")
    "'"$kvp"'" eval -m "'"$m"'" -t 1 --task "${task%_prose}" --lengths "$len" \
        --depths 0,25,50,75,100 --samples "'"${SAMPLES:-20}"'" --seed "$seed" --json "${extra[@]}" \
        2>/dev/null | jq -c --arg t "$task" ". + {row: \$t}" > "'"$parts"'/$seed-$len-$task.jsonl"' _
cat "$parts"/*.jsonl > "$dst"
echo "| seed | length | passkey | passkey, prose filler | niah_single | niah_multikey |"
echo "|---|---|---|---|---|---|"
jq -rs '
  def acc(r): (map(select(.row == r)) | if length == 0 then "–" else
      ((map(.accuracy * .samples) | add) / (map(.samples) | add) * 100 | tostring | .[0:5]) + " %" end);
  group_by([.seed, .length]) | .[] |
  "| \(.[0].seed) | \(.[0].length) | \(acc("passkey")) | \(acc("passkey_prose")) | \(acc("niah_single")) | \(acc("niah_multikey")) |"' "$dst"
echo "(JSON lines: $dst)"
