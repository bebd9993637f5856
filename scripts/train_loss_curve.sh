#!/usr/bin/env bash
# The same short training run in both precisions (same seed, data, schedule and shipped model
# shape), and how far apart the loss curves are: one JSON object on stdout with the mean loss
# of every window of steps for f32 and bf16, the largest relative difference between them
# against the stated margin (MARGIN, default 0.05; exit status 1 beyond it), the difference
# over the last window, and each run's tokens/s. Needs ../shared/data/tinystories.
#   scripts/train_loss_curve.sh [STEPS] [CTX] [WINDOW]      (default 300 steps at ctx 256, 25)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bin="${KVPRED:-$root/build/kvpred}"
data="$root/../shared/data/tinystories/tinystories_val.txt"
steps="${1:-300}" ctx="${2:-256}" window="${3:-25}" margin="${MARGIN:-0.05}"
if [ ! -f "$data" ]; then
    echo "train_loss_curve: $data not found (../shared is needed), nothing to compare" >&2
    exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for p in f32 bf16; do
    "$bin" train-lm --data "$data" --ckpt "$tmp/$p.ckpt" --ckpt-every 0 --eval-samples 0 \
        --dim 128 --layers 4 --heads 4 --kv-heads 2 --ff 352 --vocab 1024 --ctx "$ctx" \
        --curriculum "$ctx:1" --batch 8 --steps "$steps" --lr 3e-3 --threads 2 --seed 1 \
        --precision "$p" 2>"$tmp/$p.log"
done
awk -v window="$window" -v steps="$steps" -v ctx="$ctx" -v margin="$margin" '
    FNR == 1 { f++ }
    /^step [0-9]+\/[0-9]+ loss / {
        split($2, s, "/"); w = int((s[1] - 1) / window)
        sum[f, w] += $4; cnt[f, w]++; if (w + 1 > nw) nw = w + 1
        for (i = 1; i <= NF; i++) if ($i == "tok/s") tps[f] = $(i + 1)
    }
    END {
        worst = 0
        for (w = 0; w < nw; w++) {
            a[w] = sum[1, w] / cnt[1, w]; b[w] = sum[2, w] / cnt[2, w]
            d = (b[w] - a[w]) / a[w]; if (d < 0) d = -d; if (d > worst) worst = d
        }
        printf "{\n  \"steps\": %d, \"ctx\": %d, \"tokens_per_step\": %d, \"window\": %d,\n", \
            steps, ctx, 8 * ctx, window
        printf "  \"f32\": ["; for (w = 0; w < nw; w++) printf "%s%.4f", w ? ", " : "", a[w]; print "],"
        printf "  \"bf16\": ["; for (w = 0; w < nw; w++) printf "%s%.4f", w ? ", " : "", b[w]; print "],"
        last = (b[nw - 1] - a[nw - 1]) / a[nw - 1]
        printf "  \"max_rel_diff\": %.4f, \"last_window_rel_diff\": %.4f, \"margin\": %.4f,\n", \
            worst, last, margin
        printf "  \"within_margin\": %s,\n", worst <= margin ? "true" : "false"
        printf "  \"tokens_per_s\": {\"f32\": %d, \"bf16\": %d}\n}\n", tps[1], tps[2]
        exit worst <= margin ? 0 : 1
    }' "$tmp/f32.log" "$tmp/bf16.log"
