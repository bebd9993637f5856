#!/usr/bin/env bash
# Build kvpred and run the main job on the default model: a short story, then a pass key hidden
# in a long prompt, retrieved with the full cache and with sparse policies reading 1/16 of it.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"${JOBS:-2}" --target kvpred_cli
kvp=./build/kvpred
$kvp run -p "Once upon a time" -n 200 "$@"
echo

# The long-context part needs the shipped model (stories260K cannot retrieve).
model=models/kvpred-default.gguf
[ -f "$model" ] || exit 0
prompt="$(mktemp)"
trap 'rm -f "$prompt"' EXIT
noise="The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
key=68214
{
    printf 'There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. I will quiz you about the important information there.\n'
    for i in $(seq 1 46); do printf '%s ' "$noise"; done
    printf '\nThe pass key is %s. Remember it. %s is the pass key.\n' "$key" "$key"
    for i in $(seq 1 46); do printf '%s ' "$noise"; done
    printf '\nWhat is the pass key? The pass key is'
} > "$prompt"
n_tokens="$($kvp tokenize -m "$model" -f "$prompt" | wc -w)"
echo "== pass key $key hidden in the middle of a $n_tokens-token prompt"
for p in "full" "streaming --budget 1/16" "quest --budget 1/16" "snapkv --budget 1/16"; do
    # shellcheck disable=SC2086
    out="$($kvp run -m "$model" -f "$prompt" -n 8 --policy $p 2>/dev/null)"
    answer="${out##*What is the pass key? The pass key is}"
    printf '%-26s ->%s\n' "$p" "${answer%%$'\n'*}"
done
