#!/usr/bin/env bash
# kvpred against llama.cpp on the same random-weight GGUF files (`kvpred synth`), the two engines
# run in alternation so both see the same host. Prints a markdown table built with jq from the
# JSON lines it collects (OUT/results.jsonl) and writes it to OUT/table.md.
#
#   scripts/bench_peers.sh            # about 13 minutes on an idle 2-core host
#   REPS=1 LONG="" scripts/bench_peers.sh   # a quick check: no long-context rows
#
# Rows, each at 1 and 2 threads, medians of REPS alternating runs: pp512, prefill of 512 tokens
# (kvpred bench, llama-bench); tg128, decode of 128 tokens from an almost empty cache (kvpred
# bench -c 1 --prefill 16, llama-bench's tg128 from an empty one); tg128 @512, decode of 128
# tokens with 512 already cached (kvpred bench -c 512, llama-batched-bench -npp 512); decode with
# LONG tokens cached at 2 threads on the SmolLM2-135M Q8_0 file (kvpred dense, quest at 1/16, and
# quest at 1/16 with every layer sparse and the coarse pass,
# llama.cpp's llama-batched-bench with its default f16 KV cache, no flash attention); peak RSS
# (/usr/bin/time) of the short runs. Models: SmolLM2-135M (all 30 layers) and Llama-3.2-1B cut to
# L1B_LAYERS layers, each in Q8_0 and Q4_K, vocabulary 512 (synth's default). Also checks that
# each engine loads the other's quantized file (llama-quantize -> kvpred, kvpred quantize ->
# llama-bench).
#
# The peer binaries are built for another CPU: where llama-bench dies of SIGILL (exit 132) the
# static llama-server stands in for llama-bench and llama-batched-bench
# (scripts/llama_server_bench.py: pp512 is the median of 3 /completion prompts of 512 tokens;
# tg128 is 128 tokens generated after an 8-token prompt, tg128 @512 and the long rows after a
# prompt of that length, in one slot), every llama.cpp row then says "peer":"llama-server", and
# the checks that need llama-bench or llama-quantize say they were skipped. The Q4_K
# Llama-3.2-1B-shape prefill row alone:
#
#   REPS=3 SHAPES=l1b TYPES=Q4_K THREADS=2 LONG="" scripts/bench_peers.sh
#
# Environment: KVP (kvpred binary, default build/kvpred), LLAMA_BIN (default
# ../shared/peers/llama.cpp/bin), OUT (default /tmp/kvp-bench-peers; synth files are kept there
# and reused), REPS (3), L1B_LAYERS (4), LONG ("4096 16384"), THREADS ("1 2"), TYPES
# ("Q8_0 Q4_K"), SHAPES ("smol l1b"), KEEP_BLAS_CORETYPE (0); TABLE_ONLY=1 prints the table of
# the results already in OUT without measuring.
set -euo pipefail

cd "$(dirname "$0")/.."
KVP=${KVP:-build/kvpred}
LLAMA_BIN=${LLAMA_BIN:-../shared/peers/llama.cpp/bin}
OUT=${OUT:-/tmp/kvp-bench-peers}
REPS=${REPS:-3}
L1B_LAYERS=${L1B_LAYERS:-4}
LONG=${LONG-4096 16384}
THREADS=${THREADS:-1 2}
TYPES=${TYPES:-Q8_0 Q4_K}
SHAPES=${SHAPES:-smol l1b}
export LD_LIBRARY_PATH="$LLAMA_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# kvpred's prefill runs OpenBLAS sgemm for the weight types without the integer GEMM (Q4_K in
# these files; every type without AVX-512 VNNI), whose kernels follow OPENBLAS_CORETYPE; an
# environment that pins it (this project's sets Haswell, AVX2) makes that ~1.5x slower on an
# AVX-512 CPU than OpenBLAS's own choice. KEEP_BLAS_CORETYPE=1 keeps the variable.
[ "${KEEP_BLAS_CORETYPE:-0}" = 1 ] || unset OPENBLAS_CORETYPE

. scripts/lib.sh
kvp_need bench_peers jq /usr/bin/time "$KVP" "$LLAMA_BIN/llama-bench" \
    "$LLAMA_BIN/llama-batched-bench" "$LLAMA_BIN/llama-quantize"
mkdir -p "$OUT"
RES="$OUT/results.jsonl"
start=$(date +%s)
loads=()
if [ "${TABLE_ONLY:-0}" != 1 ]; then
: >"$RES"

shape_name() { case $1 in smol) echo SmolLM2-135M ;; l1b) echo Llama-3.2-1B ;; esac; }
shape_layers() { case $1 in smol) echo 30 ;; l1b) echo "$L1B_LAYERS" ;; esac; }
model_file() { echo "$OUT/$1-L$(shape_layers "$1")-$2.gguf"; }

# record ENGINE SHAPE TYPE THREADS TEST TOKENS_PER_S RSS_KB: llama.cpp rows say which tool ran
record() {
    local peer=null
    [ "$1" = llama.cpp ] && peer=\"$PEER_TOOL\"
    jq -nc --arg e "$1" --arg s "$(shape_name "$2")" --arg l "$(shape_layers "$2")" --arg ty "$3" \
        --argjson t "$4" --arg test "$5" --argjson v "$6" --argjson rss "${7:-null}" \
        --argjson peer "$peer" \
        '{engine:$e, shape:$s, layers:($l|tonumber), type:$ty, threads:$t, test:$test,
          tokens_per_s:$v, rss_kb:$rss} + (if $peer then {peer:$peer} else {} end)' >>"$RES"
}

# server_tg FILE THREADS NPP NTG: llama-server's decode tokens/s of NTG tokens after an
# NPP-token prompt, one slot (llama_server_bench.py batched at npl 1)
server_tg() {
    python3 scripts/llama_server_bench.py --server "$LLAMA_BIN/llama-server" --model "$1" \
        --threads "$2" --log "$OUT/llama-server.log" batched --npp "$3" --ntg "$4" --npl 1 |
        jq .tg_tokens_per_s
}

# ---- the peer: llama-bench, or llama-server where llama-bench dies of SIGILL ----
PEER_TOOL=llama-bench
probe=$(model_file smol Q8_0)
[ -s "$probe" ] || "$KVP" synth --shape SmolLM2-135M --layers 30 --type Q8_0 -t 2 -o "$probe"
set +e
"$LLAMA_BIN/llama-bench" -m "$probe" -p 8 -n 0 -r 1 -t 1 >/dev/null 2>&1
[ $? -eq 132 ] && PEER_TOOL=llama-server
set -e
[ "$PEER_TOOL" = llama-server ] &&
    echo "bench_peers: llama-bench dies of SIGILL here; llama-server stands in" >&2

# ---- files ----
for s in $SHAPES; do
    for ty in $TYPES; do
        f=$(model_file "$s" "$ty")
        [ -s "$f" ] || "$KVP" synth --shape "$(shape_name "$s")" --layers "$(shape_layers "$s")" \
            --type "$ty" -t 2 -o "$f"
    done
done

# ---- short context, alternating ----
# timed CMD...: runs CMD with its peak RSS (KiB) left in $rss
timed() {
    /usr/bin/time -f %M -o "$OUT/rss" "$@"
    rss=$(tail -1 "$OUT/rss")
}
for s in $SHAPES; do
    for ty in $TYPES; do
        f=$(model_file "$s" "$ty")
        for t in $THREADS; do
            for r in $(seq "$REPS"); do
                # pp512, then tg128 @512: 128 decoded with 512..640 cached
                timed "$KVP" bench -m "$f" -c 512 --prefill 512 -n 128 -t "$t" -r 1 \
                    --bandwidth 1 --json >"$OUT/kvp.json"
                record kvpred "$s" "$ty" "$t" pp512 "$(jq .prefill_tokens_per_s "$OUT/kvp.json")" "$rss"
                record kvpred "$s" "$ty" "$t" "tg128 @512" "$(jq .decode_tokens_per_s "$OUT/kvp.json")" "$rss"
                # pp512, tg128 (0..128 cached)
                if [ "$PEER_TOOL" = llama-server ]; then
                    timed python3 scripts/llama_server_bench.py --server "$LLAMA_BIN/llama-server" \
                        --model "$f" --threads "$t" --log "$OUT/llama-server.log" pp --npp 512 \
                        --reps 3 >"$OUT/llama.json"
                    record llama.cpp "$s" "$ty" "$t" pp512 "$(jq .tokens_per_s "$OUT/llama.json")" \
                        "$rss"
                    record llama.cpp "$s" "$ty" "$t" tg128 "$(server_tg "$f" "$t" 8 128)"
                else
                    timed "$LLAMA_BIN/llama-bench" -m "$f" -p 512 -n 128 -t "$t" -r 1 -o json \
                        >"$OUT/llama.json" 2>/dev/null
                    record llama.cpp "$s" "$ty" "$t" pp512 \
                        "$(jq '.[] | select(.n_prompt > 0) | .avg_ts' "$OUT/llama.json")" "$rss"
                    record llama.cpp "$s" "$ty" "$t" tg128 \
                        "$(jq '.[] | select(.n_gen > 0) | .avg_ts' "$OUT/llama.json")" "$rss"
                fi
                # tg128: 128 decoded with 1..129 cached (the 16-token prefill is not recorded)
                timed "$KVP" bench -m "$f" -c 1 --prefill 16 -n 128 -t "$t" -r 1 --bandwidth 1 \
                    --json >"$OUT/kvp.json"
                record kvpred "$s" "$ty" "$t" tg128 "$(jq .decode_tokens_per_s "$OUT/kvp.json")" "$rss"
                # tg128 @512
                if [ "$PEER_TOOL" = llama-server ]; then
                    record llama.cpp "$s" "$ty" "$t" "tg128 @512" "$(server_tg "$f" "$t" 512 128)"
                    continue
                fi
                timed "$LLAMA_BIN/llama-batched-bench" -m "$f" -c 700 -b 2048 -ub 512 -npp 512 \
                    -ntg 128 -npl 1 -t "$t" --output-format jsonl >"$OUT/llama.out" 2>/dev/null
                grep '^{' "$OUT/llama.out" >"$OUT/llama.json"
                record llama.cpp "$s" "$ty" "$t" "tg128 @512" "$(jq .speed_tg "$OUT/llama.json")" "$rss"
            done
        done
    done
done

# ---- long context: SmolLM2-135M Q8_0, 2 threads ----
f=$(model_file smol Q8_0)
for ctx in $LONG; do
    [ -s "$f" ] || break
    "$KVP" bench -m "$f" -c "$ctx" --prefill 16 -n 32 -t 2 -r 1 --bandwidth 1 --json >"$OUT/kvp.json"
    record kvpred smol Q8_0 2 "tg@$ctx dense" "$(jq .decode_tokens_per_s "$OUT/kvp.json")"
    "$KVP" bench -m "$f" -c "$ctx" --prefill 16 -n 32 -t 2 -r 1 --bandwidth 1 --policy quest \
        --budget 1/16 --json >"$OUT/kvp.json"
    record kvpred smol Q8_0 2 "tg@$ctx quest 1/16" "$(jq .decode_tokens_per_s "$OUT/kvp.json")"
    # every layer sparse, groups ranked first (docs/policies.md, "Coarse-to-fine")
    "$KVP" bench -m "$f" -c "$ctx" --prefill 16 -n 32 -t 2 -r 1 --bandwidth 1 --policy quest \
        --budget 1/16 --dense-layers 0 --policy-opts groups=16,coarse=approx,visit=4 \
        --json >"$OUT/kvp.json"
    record kvpred smol Q8_0 2 "tg@$ctx quest 1/16, no dense layers, coarse" \
        "$(jq .decode_tokens_per_s "$OUT/kvp.json")"
    if [ "$PEER_TOOL" = llama-server ]; then
        record llama.cpp smol Q8_0 2 "tg@$ctx dense" "$(server_tg "$f" 2 "$ctx" 32)"
        continue
    fi
    "$LLAMA_BIN/llama-batched-bench" -m "$f" -c $((ctx + 64)) -b 2048 -ub 512 -npp "$ctx" -ntg 32 \
        -npl 1 -t 2 --output-format jsonl 2>/dev/null | grep '^{' >"$OUT/llama.json"
    record llama.cpp smol Q8_0 2 "tg@$ctx dense" "$(jq .speed_tg "$OUT/llama.json")"
done

# ---- each engine loads the other's quantized file ----
if [ "$PEER_TOOL" = llama-server ]; then
    loads+=("cross-loading checks skipped: llama-bench and llama-quantize die of SIGILL here")
elif [ -s "$(model_file smol Q8_0)" ]; then
    f16="$OUT/smol-L1-F16.gguf"
    "$KVP" synth --shape SmolLM2-135M --layers 1 --type F16 -o "$f16" >/dev/null
    "$LLAMA_BIN/llama-quantize" "$f16" "$OUT/by-llama-Q4_K_M.gguf" Q4_K_M >/dev/null 2>&1
    "$KVP" quantize "$f16" "$OUT/by-kvpred-Q5_K.gguf" --type Q5_K >/dev/null
    if "$KVP" bench -m "$OUT/by-llama-Q4_K_M.gguf" -c 32 --prefill 16 -n 8 -r 1 --bandwidth 1 \
        --json >/dev/null; then
        loads+=("kvpred runs llama-quantize's Q4_K_M: yes")
    else
        loads+=("kvpred runs llama-quantize's Q4_K_M: NO")
    fi
    if "$LLAMA_BIN/llama-bench" -m "$OUT/by-kvpred-Q5_K.gguf" -p 16 -n 8 -r 1 >/dev/null 2>&1; then
        loads+=("llama-bench runs kvpred quantize's Q5_K: yes")
    else
        loads+=("llama-bench runs kvpred quantize's Q5_K: NO")
    fi
fi

fi # TABLE_ONLY

# ---- the table ----
{
    echo "| shape (layers) | type | test | threads | kvpred tok/s | llama.cpp tok/s | ratio | peak RSS kvpred / llama.cpp MiB |"
    echo "|---|---|---|---|---|---|---|---|"
    jq -rs '
      def median: sort | if length == 0 then null
                         elif length % 2 == 1 then .[length/2|floor]
                         else (.[length/2 - 1] + .[length/2]) / 2 end;
      def f1: if . == null then "" else (. * 10 | round / 10 | tostring) end;
      def mib: if . == null then "" else (. / 1024 | round | tostring) end;
      group_by([.shape, .type, .test, .threads])
      | map({shape: .[0].shape, layers: .[0].layers, type: .[0].type, test: .[0].test,
             threads: .[0].threads,
             k: ([.[] | select(.engine == "kvpred") | .tokens_per_s] | median),
             l: ([.[] | select(.engine == "llama.cpp") | .tokens_per_s] | median),
             kr: ([.[] | select(.engine == "kvpred") | .rss_kb | select(. != null)] | max),
             lr: ([.[] | select(.engine == "llama.cpp") | .rss_kb | select(. != null)] | max)})
      | . as $rows
      | map(. as $d0 | if .l == null and (.test | test("quest")) then   # quest vs llama.cpp dense
              (.test | sub(" quest.*"; " dense")) as $d
              | .l = ([$rows[] | select(.shape == $d0.shape and .type == $d0.type and
                                        .threads == $d0.threads and .test == $d) | .l][0])
              | .vs = " (vs its dense)"
            else . end)
      | sort_by(.shape, .type, (.test | test("^tg@")), .test, .threads)
      | .[]
      | "| \(.shape) (\(.layers)) | \(.type) | \(.test) | \(.threads) | \(.k | f1) | \(.l | f1) | " +
        (if .k != null and .l != null then "\(.k / .l * 100 | round / 100)x\(.vs // "")" else "" end) +
        " | " + (if .kr != null then "\(.kr | mib) / \(.lr | mib)" else "" end) + " |"' "$RES"
} >"$OUT/table.md"
cat "$OUT/table.md"
for l in "${loads[@]}"; do echo "- $l"; done
if [ "${TABLE_ONLY:-0}" != 1 ] && [ "$PEER_TOOL" = llama-server ]; then
    echo "- llama.cpp columns: llama-server standing in for llama-bench / llama-batched-bench"
fi
echo "($(($(date +%s) - start)) s; reps $REPS; raw results in $RES)"
