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

# The long-context part needs the shipped model (stories260K cannot retrieve); its trained
# context is 8192, and the prompt fills nearly all of it.
model=models/kvpred-default.gguf
[ -f "$model" ] || exit 0
prompt="$(mktemp)"
err="$(mktemp)"
trap 'rm -f "$prompt" "$err"' EXIT
# the evaluation's own passkey prompt (`kvpred eval --task passkey` sample 0 at this length,
# depth and seed): noise lines, the key in the middle, the question
$kvp prompt -m "$model" --task passkey --length 8000 --depth 50 --seed 2 > "$prompt"
key="$($kvp prompt -m "$model" --task passkey --length 8000 --depth 50 --seed 2 --answer)"
n_tokens="$($kvp tokenize -m "$model" -f "$prompt" | wc -w)"
echo "== pass key $key hidden in the middle of a $n_tokens-token prompt"
echo "   each policy but full reads 1/16 of the cache on the layers it selects for (all but the"
echo "   first --dense-layers 2, which read everything); KV read and time per decode step over"
echo "   32 generated tokens"
printf '%-12s %-12s %22s %12s\n' policy answer "KV read (of full)" "ms / token"
for p in "full" "streaming --budget 1/16" "snapkv --budget 1/16" "quest --budget 1/16" \
    "qpredictor --budget 1/16 --aux ${model%.gguf}.qkvpp"; do
    # shellcheck disable=SC2086
    out="$($kvp run -m "$model" -f "$prompt" -n 32 --ignore-eos --policy $p 2>"$err")"
    answer="${out##*What is the pass key? The pass key is}"
    answer="${answer%%$'\n'*}"
    answer="${answer%%.*}" # the answer ends at its full stop (32 tokens run on past the end)
    # run's statistics on stderr: decode tokens and milliseconds, then the KV read per step
    ms="$(sed -n 's/.*generated \([0-9]*\) tokens in \([0-9.]*\) ms.*/\2 \1/p' "$err" |
        awk '{ printf "%.2f", $1 / $2 }')"
    read_kib="$(sed -n 's/.*KV read per decode step .*(\([0-9.]*\)%, \([0-9]*\) KiB.*/\2 KiB (\1%)/p' "$err")"
    [ -n "$read_kib" ] || read_kib="?"
    printf '%-12s %-12.12s %22s %12s\n' "${p%% *}" "${answer# }" "$read_kib" "$ms"
done
