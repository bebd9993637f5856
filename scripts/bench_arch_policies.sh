#!/usr/bin/env bash
# The sparse policies on Gemma shapes (`kvpred synth`, random weights) at a long context: decode
# speed with each policy at a budget of 1/16 against dense attention, and where the time and the
# KV memory go between the sliding-window layers (rings of their window, dense, no policy) and
# the global layers (the whole context, where the policy selects). One JSON object per run on
# stdout and in OUT/results.jsonl, then one summary object (per shape and policy: tokens/s, the
# policy's share of the decode time, the windowed and global layers' shares of the attention
# time and of the resident KV bytes; date, commit, machine).
#
#   scripts/bench_arch_policies.sh > bench/arch_policies.json    # 32768 tokens, quiet machine
#   CTX=2048 N=8 scripts/bench_arch_policies.sh                  # a quick check
#
# Shapes are cut to a few layers so a 32768-token prompt prefills in minutes (bench fills the
# cache by prefilling the whole context; tiling is refused on sliding-window caches): Gemma 3 1B
# to 6 layers (5 local with a window of 512, 1 global: the real model's 22 + 4 is the same ratio
# but for its two last local layers), Gemma 2 2B to 2 (1 local with a window of 4096, 1 global
# with soft-capped scores). SHAPES ("Gemma-3-1B:6 Gemma-2-2B:2", NAME:LAYERS, 0 = the whole
# shape), POLICIES ("none quest oracle qpredictor snapkv streaming"; none = dense attention,
# qpredictor reads models/kvpred-default.qkvpp), BUDGET (1/16), CTX (32768), N (decode tokens
# timed, 32), REPS (1), TYPE (Q8_0), THREADS (2), KVP (build/kvpred), OUT
# (/tmp/kvp-bench-arch-policies; synth files are kept there and reused), DENSE_LAYERS (0: the
# engine's default of 2 dense leading layers would hold the cut Gemma 2's only global layer, and
# its policies would select nothing).
set -euo pipefail

cd "$(dirname "$0")/.."
KVP=${KVP:-build/kvpred}
OUT=${OUT:-/tmp/kvp-bench-arch-policies}
SHAPES=${SHAPES:-Gemma-3-1B:6 Gemma-2-2B:2}
POLICIES=${POLICIES:-none quest oracle qpredictor snapkv streaming}
BUDGET=${BUDGET:-1/16}
CTX=${CTX:-32768}
N=${N:-32}
REPS=${REPS:-1}
TYPE=${TYPE:-Q8_0}
THREADS=${THREADS:-2}
QPRED=${QPRED:-models/kvpred-default.qkvpp}
DENSE_LAYERS=${DENSE_LAYERS:-0}
unset OPENBLAS_CORETYPE # OpenBLAS picks its own kernels (see bench_peers.sh)

for tool in jq "$KVP"; do
    command -v "$tool" >/dev/null || { echo "bench_arch_policies: $tool not found" >&2; exit 1; }
done
mkdir -p "$OUT"
RES="$OUT/results.jsonl"
: >"$RES"

for sl in $SHAPES; do
    shape=${sl%%:*} layers=${sl##*:}
    f="$OUT/$shape-$TYPE-L$layers.gguf"
    if [ ! -s "$f" ]; then
        cut=()
        [ "$layers" -gt 0 ] && cut=(--layers "$layers")
        "$KVP" synth --shape "$shape" --type "$TYPE" "${cut[@]}" -t "$THREADS" -o "$f" >&2
    fi
    for pol in $POLICIES; do
        args=(-m "$f" -c "$CTX" -n "$N" --prefill 64 -r "$REPS" -t "$THREADS" --json)
        [ "$pol" != none ] && args+=(--policy "$pol" --budget "$BUDGET" --dense-layers "$DENSE_LAYERS")
        [ "$pol" = qpredictor ] && args+=(--aux "$QPRED")
        "$KVP" bench "${args[@]}" >"$OUT/run.json"
        jq -c --arg shape "$shape" --argjson layers "$layers" --argjson dl "$DENSE_LAYERS" \
            '{shape: $shape, layers: $layers, dense_layers: (if .policy == "none" then null else $dl end),
            policy, budget, ctx, threads, weight_type, decode_tokens_per_s,
            decode_ms_per_token, policy_share: (.policy_share // 0),
            windowed_attention_share, global_attention_share,
            windowed_attention_ms_per_token, global_attention_ms_per_token,
            kv_resident_bytes, windowed_kv_bytes, windowed_kv_share,
            kv_read_bytes_per_token, fill_seconds}' "$OUT/run.json" | tee -a "$RES"
    done
done

machine=$(lscpu 2>/dev/null | sed -n 's/^Model name: *//p' | head -1)
jq -sc --arg date "$(date -u +%Y-%m-%dT%H:%M:%SZ)" \
    --arg commit "$(git rev-parse --short HEAD 2>/dev/null || echo unknown)" \
    --arg machine "${machine:-unknown} ($(nproc) CPUs)" --argjson threads "$THREADS" \
    '{summary: "sparse policies on Gemma shapes: decode tokens/s, the policy'"'"'s share, the
      windowed (sliding-window) and global layers'"'"' shares of attention time and resident KV",
      date: $date, commit: $commit, machine: $machine, threads: $threads,
      rows: [.[] | {shape, layers, dense_layers, policy, budget, ctx, decode_tokens_per_s, policy_share,
                    windowed_attention_share, global_attention_share, windowed_kv_share,
                    kv_resident_mib: (.kv_resident_bytes / 1048576)}]}' "$RES"
