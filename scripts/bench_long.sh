#!/usr/bin/env bash
# Decode far past 32K tokens (docs/performance.md, "Long contexts"): dense against quest and
# qpredictor at budgets of 1/16, 1/32 and 1/64 of the context, on random-weight files with the
# shapes of SmolLM2-135M and Llama-3.2-1B (`kvpred synth`, Q8_0) and on the shipped model.
#
# Caches are filled with `bench --fill tile`: FILL_SOURCE tokens of an essay are prefilled for
# real, their KV is tiled to the context with every key turned by RoPE to its new position
# (kvp_ctx_fill_tile), and the last 32 tokens are prefilled for real. The shipped model is
# prefilled for real up to REAL_MAX tokens (default 32768) and tiled beyond.
#
#   scripts/bench_long.sh [BUILD_DIR] PART...
#     sparse   dense and every POLICIES entry at every budget, each context, each shape
#     disk     the disk tier with token prefetch paired (bench --paired) against RAM sparse,
#              quest and qpredictor at DISK_BUDGET, contexts DISK_CTXS, shapes DISK_SHAPES,
#              the hot tier capped at 1/HOT_FRAC of the KV (--hot-budget ctx/HOT_FRAC tokens
#              per layer: a unit holds every KV head of a block, so that is 1/HOT_FRAC of the
#              layer's KV)
#     peer     llama.cpp's llama-server dense at PEER_CTX on the SmolLM2-135M shape, alternating
#              with kvpred dense and quest at 1/16 (llama-server is the peer that runs on hosts
#              where llama-bench dies of an illegal instruction)
#     real     no tile: one real prefill per shape and context of a prompt of essays (TEXT,
#              repeated to the length), with REAL_PREFILL (the block-sparse prefill at 1/16 by
#              default, docs/prefill.md), then every REAL_POLICIES entry decodes from that one
#              fill (`bench` with several --policy: each goes back to the fill's last 32
#              tokens, attaches its policy, evaluates them and decodes): one record each, with
#              the fill's seconds and density (fill_seconds, fill_density) beside its own rates
#   env: SHAPES ("smol135m llama1b default"), CTXS ("32768 65536 131072"), BUDGETS ("1/16 1/32
#        1/64"), N (decode tokens, 16), THREADS (2), OUT (bench/long_decode.jsonl, appended),
#        DEFAULT_MODEL (the file of the shape "default", models/kvpred-default.gguf),
#        POLICIES (";"-separated "label=bench flags" entries, default flat quest and qpredictor;
#        add e.g. "quest coarse=--policy quest --policy-opts ..." ), FILL_SOURCE (4096),
#        FILL_TEXT (../shared/data/pg_essays/worked.txt when present), L1B_LAYERS (16), DIR
#        (/tmp/kvp-long: the synth files), TEXT (../shared/data/pg_essays: a file or a folder of
#        .txt files, the real part's prompt), REAL_PREFILL ("--prefill-policy sparse
#        --prefill-budget 1/16"), REAL_BUDGET (1/32), REAL_POLICIES (";"-separated
#        "label=bench flags": dense, quest as shipped, quest and qpredictor coarse-to-fine with
#        every layer sparse, at REAL_BUDGET: the README's long-context table), DISK_CTXS (131072), DISK_SHAPES (smol135m: the shapes
#        of the disk part), DISK_BUDGET (1/32), KV_DIR
#        (/tmp), PEER_CTX (32768), PEER_BIN (../shared/peers/llama.cpp/bin), PORT (18080),
#        WRAP (a prefix for every timed command, e.g. "flock LOCK nice -n -20" on a shared host),
#        SERVER_PREFIX (the same for llama-server's process, e.g. "nice -n -20"), HOT_FRAC (8),
#        NOTE (how the host was: "nice -20, loaded host" by default; say "idle host" when it was)
# Each record gets label, shape, part, note and command (the bench invocation) fields, and
# date, commit and machine at the end
# (`scripts/bench_tables.py --stamp OUT`).
#
# The 128K rows of the SmolLM2-135M shape, each command under 10 minutes on a 2-core host:
#   SHAPES=smol135m CTXS=131072 scripts/bench_long.sh build sparse   (dense, quest and
#       qpredictor at 1/16 1/32 1/64: 7 rows, a tiled fill of ~35 s each)
#   scripts/bench_long.sh build disk                                  (2 paired rows)
# The README's long-context table from real prefills (about 11 minutes on a 2-core host: sparse
# prefills of 43 s, 2 and 7 minutes, then four 16-token decodes each):
#   SHAPES=smol135m OUT=bench/long_decode_real.jsonl NOTE="idle host" WRAP="nice -n -20" \
#       scripts/bench_long.sh build real
set -euo pipefail
. "$(dirname "$0")/lib.sh"
BUILD=${1:-build}
shift || true
PARTS=${*:-sparse}
KVP=$BUILD/kvpred
SHAPES=${SHAPES:-"smol135m llama1b default"}
CTXS=${CTXS:-"32768 65536 131072"}
BUDGETS=${BUDGETS:-"1/16 1/32 1/64"}
N=${N:-16}
THREADS=${THREADS:-2}
OUT=${OUT:-bench/long_decode.jsonl}
QKVPP=${QKVPP:-models/kvpred-default.qkvpp}
POLICIES=${POLICIES:-"quest=--policy quest;qpredictor=--policy qpredictor --aux $QKVPP"}
FILL_SOURCE=${FILL_SOURCE:-4096}
FILL_TEXT=${FILL_TEXT:-../shared/data/pg_essays/worked.txt}
L1B_LAYERS=${L1B_LAYERS:-16}
DIR=${DIR:-/tmp/kvp-long}
DISK_CTXS=${DISK_CTXS:-131072}
DISK_SHAPES=${DISK_SHAPES:-smol135m}
DISK_BUDGET=${DISK_BUDGET:-1/32}
KV_DIR=${KV_DIR:-/tmp}
PEER_CTX=${PEER_CTX:-32768}
PEER_BIN=${PEER_BIN:-../shared/peers/llama.cpp/bin}
PORT=${PORT:-18080}
REAL_MAX=${REAL_MAX:-32768}
HOT_FRAC=${HOT_FRAC:-8}
NOTE=${NOTE:-"2 threads; nice -20, loaded host (a shared lock, beside nice-19 compile jobs)"}
TEXT=${TEXT:-../shared/data/pg_essays}
REAL_PREFILL=${REAL_PREFILL:-"--prefill-policy sparse --prefill-budget 1/16"}
REAL_BUDGET=${REAL_BUDGET:-1/32}
C2F="--dense-layers 0 --policy-opts groups=16,coarse=approx,visit=4,q8=1"
REAL_POLICIES=${REAL_POLICIES:-"dense=--policy none;quest=--policy quest --budget $REAL_BUDGET\
;quest coarse-to-fine=--policy quest $C2F --budget $REAL_BUDGET\
;qpredictor coarse-to-fine=--policy qpredictor --aux $QKVPP $C2F --budget $REAL_BUDGET"}
# shellcheck disable=SC2206
WRAP=(${WRAP:-})
mkdir -p "$DIR"
TEXTF=()
[ -f "$FILL_TEXT" ] && TEXTF=(--fill-text "$FILL_TEXT")

model_of() { # shape -> model file (made once with kvpred synth)
    case $1 in
    default) echo "${DEFAULT_MODEL:-models/kvpred-default.gguf}" ;;
    smol135m) echo "$DIR/smol135m-q8_0.gguf" ;;
    llama1b) echo "$DIR/llama1b-q8_0.gguf" ;;
    *) echo "unknown shape $1" >&2; exit 2 ;;
    esac
}
make_model() {
    local f
    f=$(model_of "$1")
    [ -s "$f" ] && return 0
    case $1 in
    smol135m) "$KVP" synth --shape SmolLM2-135M --type Q8_0 -t "$THREADS" -o "$f" >&2 ;;
    llama1b) "$KVP" synth --shape Llama-3.2-1B --layers "$L1B_LAYERS" --type Q8_0 -t "$THREADS" \
        -o "$f" >&2 ;;
    esac
}
fill_flags() { # shape ctx -> the fill flags
    if [ "$1" = default ] && [ "$2" -le "$REAL_MAX" ]; then
        echo "--fill prefill"
    else
        echo "--fill tile --fill-source $FILL_SOURCE"
    fi
}

run() { # part shape label flags...: one bench run, one JSON line appended to OUT
    local part=$1 shape=$2 label=$3; shift 3
    local m line
    m=$(model_of "$shape")
    # shellcheck disable=SC2046
    line=$("${WRAP[@]}" "$KVP" bench -m "$m" -t "$THREADS" -n "$N" -r 1 --prefill 16 --json \
        "${TEXTF[@]}" "$@" 2>/dev/null) || { echo "FAILED: $shape $label $*" >&2; return 0; }
    jq -c --arg p "$part" --arg s "$shape" --arg l "$label" --arg n "$NOTE" \
        --arg c "kvpred bench -m $m -t $THREADS -n $N -r 1 --prefill 16 --json ${TEXTF[*]} $*" \
        '. + {part: $p, shape: $s, label: $l, note: $n, command: $c}' <<< "$line" >> "$OUT"
    jq -r '"\(.shape) ctx \(.ctx) \(.label) \(.budget // "-"): \(.decode_tokens_per_s * 100 | round / 100) tok/s, policy_share \(.policy_share // 0 | . * 1000 | round / 1000), fill \(.fill_seconds | round) s" + (if .paired then ", paired ratio \(.paired.ratio_median * 100 | round / 100), hit rate \(.store.hit_rate * 1000 | round / 1000), hot \(.store.hot_bytes / .store.cold_bytes * 1000 | round / 1000) of the KV" else "" end)' \
        <<< "$(tail -n 1 "$OUT")" >&2
}

part_sparse() {
    for s in $SHAPES; do
        make_model "$s"
        for c in $CTXS; do
            # shellcheck disable=SC2046
            run sparse "$s" dense -c "$c" $(fill_flags "$s" "$c")
            for b in $BUDGETS; do
                IFS=';' read -ra pols <<< "$POLICIES"
                for p in "${pols[@]}"; do
                    # shellcheck disable=SC2046,SC2086
                    run sparse "$s" "${p%%=*}" -c "$c" $(fill_flags "$s" "$c") ${p#*=} --budget "$b"
                done
            done
        done
    done
}

part_disk() {
    for s in $DISK_SHAPES; do
        make_model "$s"
        for c in $DISK_CTXS; do
            IFS=';' read -ra pols <<< "$POLICIES"
            for p in "${pols[@]}"; do
                # shellcheck disable=SC2046,SC2086
                run disk "$s" "${p%%=*}" -c "$c" $(fill_flags "$s" "$c") ${p#*=} \
                    --budget "$DISK_BUDGET" --kv-tier disk --kv-dir "$KV_DIR" --prefetch token \
                    --paired --hot-budget $((c / HOT_FRAC))
            done
        done
    done
}

# llama-server: a PEER_CTX-token prompt of token ids (the synth vocabulary's) to /completion
# with n_predict N_PEER; its timings.predicted_per_second is llama.cpp's decode rate at that
# depth (prompt_per_second its prefill), dense (no flash attention), f16 KV, THREADS threads
part_peer() {
    make_model smol135m
    local m srv_pid n_prompt=$((PEER_CTX - 16)) np=${N_PEER:-32}
    m=$(model_of smol135m)
    # shellcheck disable=SC2086
    ${SERVER_PREFIX:-} "$PEER_BIN/llama-server" -m "$m" -c $((PEER_CTX + 256)) -np 1 -t "$THREADS" -tb "$THREADS" \
        --port "$PORT" --no-warmup > "$DIR/llama-server.log" 2>&1 &
    srv_pid=$!
    trap 'kill $srv_pid 2>/dev/null || true' EXIT
    for _ in $(seq 120); do
        curl -sf "http://127.0.0.1:$PORT/health" > /dev/null && break
        sleep 1
    done
    python3 -c "
import json, random
random.seed(7)
print(json.dumps({'prompt': [random.randrange(3, 512) for _ in range($n_prompt)],
                  'n_predict': $np, 'cache_prompt': False, 'temperature': 0,
                  'ignore_eos': True}))" > "$DIR/peer_prompt.json"
    # shellcheck disable=SC2046
    run peer smol135m "kvpred dense" -c "$PEER_CTX" $(fill_flags smol135m "$PEER_CTX")
    local t
    t=$("${WRAP[@]}" curl -sf "http://127.0.0.1:$PORT/completion" -H 'Content-Type: application/json' \
        -d @"$DIR/peer_prompt.json" | jq -c '.timings')
    jq -nc --argjson t "$t" --arg n "$NOTE" --argjson c "$PEER_CTX" --argjson th "$THREADS" \
        '{part: "peer", shape: "smol135m", label: "llama.cpp dense", model: "synth SmolLM2-135M",
          engine: "llama-server", ctx: $t.prompt_n, n_decode: $t.predicted_n, threads: $th,
          decode_tokens_per_s: $t.predicted_per_second, prefill_tokens_per_s: $t.prompt_per_second,
          peer_ctx: $c, flash_attn: false, kv_type: "f16", timings: $t, note: $n}' >> "$OUT"
    jq -r '"llama.cpp dense ctx \(.ctx): \(.decode_tokens_per_s * 100 | round / 100) tok/s (prefill \(.prefill_tokens_per_s | round) tok/s)"' \
        <<< "$(tail -n 1 "$OUT")" >&2
    # shellcheck disable=SC2046
    run peer smol135m quest -c "$PEER_CTX" $(fill_flags smol135m "$PEER_CTX") --policy quest \
        --budget 1/16
    kill "$srv_pid" 2>/dev/null || true
    wait "$srv_pid" 2>/dev/null || true
    trap - EXIT
}

# One real prefill per shape and context, every REAL_POLICIES entry decoding from it.
part_real() {
    local prompt="$DIR/long_prompt.txt" longest=0 c s p m out
    for c in $CTXS; do [ "$c" -gt "$longest" ] && longest=$c; done
    kvp_prompt_text "$TEXT" "$longest" "$prompt"
    local labels=() flags=()
    IFS=';' read -ra pols <<< "$REAL_POLICIES"
    for p in "${pols[@]}"; do
        labels+=("${p%%=*}")
        # shellcheck disable=SC2206
        flags+=(${p#*=})
    done
    local lj
    lj=$(printf '%s\n' "${labels[@]}" | jq -R . | jq -sc .)
    for s in $SHAPES; do
        make_model "$s"
        m=$(model_of "$s")
        for c in $CTXS; do
            # shellcheck disable=SC2086
            local args=(-m "$m" -t "$THREADS" -n "$N" -r 1 --prefill 16 --json -c "$c"
                --fill prefill $REAL_PREFILL)
            echo "bench_long: real prefill of $c tokens, $s, then ${#labels[@]} policies" >&2
            out=$("${WRAP[@]}" "$KVP" bench "${args[@]}" --fill-text "$prompt" "${flags[@]}" \
                2>/dev/null) || { echo "FAILED: $s real $c" >&2; continue; }
            jq -c --arg s "$s" --argjson l "$lj" --arg n "$NOTE" --arg t "$TEXT" \
                --arg c "kvpred bench ${args[*]} --fill-text PROMPT ${flags[*]}" \
                '. + {part: "real", shape: $s, label: $l[.policy_index], note: $n,
                      prompt: ($t + " repeated"), command: $c}' <<< "$out" >> "$OUT"
            tail -n "${#labels[@]}" "$OUT" | jq -r '"\(.shape) ctx \(.ctx) \(.label) \(.budget // "-"): \(.decode_tokens_per_s * 100 | round / 100) tok/s, policy_share \(.policy_share // 0 | . * 1000 | round / 1000), fill \(.fill_seconds | round) s at density \(.fill_density * 1000 | round / 1000)"' >&2
        done
    done
}

for part in $PARTS; do
    "part_$part"
done
python3 "$(dirname "$0")/bench_tables.py" --stamp "$OUT"
