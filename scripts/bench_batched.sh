#!/usr/bin/env bash
# Many sequences decoding together: `kvpred batched-bench` against llama.cpp's
# llama-batched-bench, run in alternation on the same random-weight GGUF files (`kvpred synth`,
# SmolLM2-135M shape, all 30 layers, Q8_0 and Q4_K), so both see the same host. Appends one JSON
# line per row (engine, date, commit, machine, and the row's numbers) to
# bench/batched_<date>.jsonl and writes the table to bench/batched_<date>.md.
#
#   scripts/bench_batched.sh                       # the full grid, on an idle host
#   NPL=1,2 NPP=64 NTG=8 REPS=1 TYPES=Q8_0 THREADS=2 QUEST=0 scripts/bench_batched.sh  # a check
#
# Rows: for each type, thread count (THREADS) and prompt length (NPP), REPS alternating turns of
# kvpred dense, kvpred with quest at 1/16 (QUEST=1; the sparse-KV case), and llama.cpp (its
# default f16 KV, no flash attention, a unified cache of NPL_max x (npp + ntg) cells), each at
# -npl NPL. Where llama-batched-bench dies of SIGILL (a peer built for another CPU) llama-server
# stands in for it (engine "llama-server"; scripts/llama_server_bench.py says how it measures). Decode rows are aggregate tokens/s over NTG generated tokens per sequence.
#
# Environment: KVP (default build/kvpred), LLAMA_BIN (../shared/peers/llama.cpp/bin), OUT (synth
# files and raw outputs, default /tmp/kvp-bench-batched), RESULTS (the bench/ prefix, default
# bench/batched_<UTC date>), REPS (1), TYPES ("Q8_0 Q4_K"), THREADS ("1 2"), NPP ("512 4096"),
# NTG (32), NPL (1,2,4,8,16), QUEST (1), FILL (copy: kvpred prefills one prompt per row and copies
# its KV into the other sequences, which then decode tokens of their own, so a row's time goes to
# the decode; prefill: every sequence prefills its own prompt), LOCK and TIMED_NICE (each engine's
# turn, one command, runs under `flock LOCK` at niceness TIMED_NICE, so a shared host's lock is
# held for one run at a time, not the whole grid).
set -euo pipefail

cd "$(dirname "$0")/.."
KVP=${KVP:-build/kvpred}
LLAMA_BIN=${LLAMA_BIN:-../shared/peers/llama.cpp/bin}
OUT=${OUT:-/tmp/kvp-bench-batched}
STAMP=$(date -u +%Y%m%dT%H%M%SZ)
RESULTS=${RESULTS:-bench/batched_$STAMP}
REPS=${REPS:-1}
TYPES=${TYPES:-Q8_0 Q4_K}
THREADS=${THREADS:-1 2}
NPP=${NPP:-512 4096}
NTG=${NTG:-32}
NPL=${NPL:-1,2,4,8,16}
QUEST=${QUEST:-1}
FILL=${FILL:-copy}
LOCK=${LOCK:-}
TIMED_NICE=${TIMED_NICE:-}
# timed CMD...: CMD under the lock and at the priority asked for
timed() {
    local pre=()
    [ -n "$LOCK" ] && pre+=(flock "$LOCK")
    # nice -n adds to the caller's niceness: the difference gives TIMED_NICE itself
    [ -n "$TIMED_NICE" ] && pre+=(nice -n "$((TIMED_NICE - $(nice)))")
    "${pre[@]}" "$@"
}
export LD_LIBRARY_PATH="$LLAMA_BIN${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
# see bench_peers.sh: OpenBLAS's own kernel choice for the sgemm prefill path
[ "${KEEP_BLAS_CORETYPE:-0}" = 1 ] || unset OPENBLAS_CORETYPE

. scripts/lib.sh
kvp_need bench_batched jq "$KVP" "$LLAMA_BIN/llama-batched-bench"
mkdir -p "$OUT" "$(dirname "$RESULTS")"
# The peer binaries are built for another CPU: where llama-batched-bench dies of SIGILL (exit
# 132) the static llama-server stands in (scripts/llama_server_bench.py: -np N slots, N concurrent
# requests; its rows say engine "llama-server", stands_in_for "llama-batched-bench").
PEER=batched-bench
probe="$OUT/smol-L30-Q8_0.gguf"
[ -s "$probe" ] || "$KVP" synth --shape SmolLM2-135M --layers 30 --type Q8_0 -t 2 -o "$probe"
set +e
"$LLAMA_BIN/llama-batched-bench" -m "$probe" -c 64 -npp 8 -ntg 1 -npl 1 -t 1 >/dev/null 2>&1
[ $? -eq 132 ] && PEER=server
set -e
[ "$PEER" = server ] && echo "bench_batched: llama-batched-bench dies of SIGILL here; llama-server stands in" >&2
RES="$RESULTS.jsonl"
COMMIT=$(kvp_commit)
MACHINE=$(kvp_machine)
npl_max=$(tr ',' '\n' <<<"$NPL" | sort -n | tail -1)

# tag ENGINE: each JSON line on stdin gets the engine, date, commit and machine
tag() {
    jq -c --arg e "$1" --arg d "$(kvp_date)" --arg c "$COMMIT" --arg m "$MACHINE" \
        '{engine:$e, date:$d, commit:$c, machine:$m} + .' >>"$RES"
}

for ty in $TYPES; do
    f="$OUT/smol-L30-$ty.gguf"
    [ -s "$f" ] || "$KVP" synth --shape SmolLM2-135M --layers 30 --type "$ty" -t 2 -o "$f"
    for t in $THREADS; do
        for npp in $NPP; do
            for r in $(seq "$REPS"); do
                timed "$KVP" batched-bench -m "$f" -npp "$npp" -ntg "$NTG" -npl "$NPL" -t "$t" \
                    --fill "$FILL" --json |
                    jq -c --arg ty "$ty" '. + {type:$ty, kv:"dense"}' | tag kvpred
                if [ "$QUEST" = 1 ]; then
                    timed "$KVP" batched-bench -m "$f" -npp "$npp" -ntg "$NTG" -npl "$NPL" \
                        -t "$t" --fill "$FILL" --policy quest --budget 1/16 --json |
                        jq -c --arg ty "$ty" '. + {type:$ty, kv:"quest 1/16"}' | tag kvpred
                fi
                if [ "$PEER" = server ]; then
                    # one server (and one lock hold) per sequence count
                    for n in ${NPL//,/ }; do
                        timed python3 scripts/llama_server_bench.py \
                            --server "$LLAMA_BIN/llama-server" --model "$f" --threads "$t" \
                            --log "$OUT/llama-server.log" batched --npp "$npp" --ntg "$NTG" \
                            --npl "$n" |
                            jq -c --arg ty "$ty" '. + {type:$ty, kv:"dense"}' | tag llama-server ||
                            echo "bench_batched: llama-server failed" >&2
                    done
                    continue
                fi
                timed "$LLAMA_BIN/llama-batched-bench" -m "$f" -c $((npl_max * (npp + NTG) + 16)) \
                    -b 2048 -ub 512 -npp "$npp" -ntg "$NTG" -npl "$NPL" -t "$t" \
                    --output-format jsonl >"$OUT/llama.out" 2>/dev/null ||
                    echo "bench_batched: llama-batched-bench failed (exit $?)" >&2
                { grep '^{' "$OUT/llama.out" || true; } |
                    jq -c --arg ty "$ty" --argjson t "$t" \
                        '{type:$ty, kv:"dense", threads:$t, npp:.pp, ntg:.tg, npl:.pl,
                          pp_tokens_per_s:.speed_pp, tg_tokens_per_s:.speed_tg,
                          t_pp_s:.t_pp, t_tg_s:.t_tg}' | tag llama.cpp
            done
        done
    done
done

# ---- the table: median decode tokens/s per row, and the ratios the targets are stated in ----
jq -rs '
  def med: sort | .[(length / 2 | floor)];
  group_by([.type, .threads, .npp, .npl]) | map({
    type: .[0].type, threads: .[0].threads, npp: .[0].npp, npl: .[0].npl,
    kd: [.[] | select(.engine == "kvpred" and .kv == "dense") | .tg_tokens_per_s] | med,
    kq: [.[] | select(.engine == "kvpred" and .kv == "quest 1/16") | .tg_tokens_per_s] | med,
    ll: [.[] | select(.engine == "llama.cpp" or .engine == "llama-server") | .tg_tokens_per_s] | med,
    kpp: [.[] | select(.engine == "kvpred" and .kv == "dense") | .pp_tokens_per_s] | med,
    lpp: [.[] | select(.engine == "llama.cpp" or .engine == "llama-server") | .pp_tokens_per_s] | med}) |
  sort_by([.type, .threads, .npp, .npl]) |
  (["| type | t | npp | npl | kvpred dense tg/s | kvpred quest 1/16 tg/s | llama.cpp tg/s |" +
    " dense / llama | quest / llama | kvpred pp/s | llama.cpp pp/s |",
    "|---|---|---|---|---|---|---|---|---|---|---|"] | .[]),
  (.[] | def f: if . == null then "-" else (. * 10 | round / 10 | tostring) end;
         def r(a; b): if a == null or b == null or b == 0 then "-"
                      else ((a / b) * 100 | round / 100 | tostring) + "x" end;
    "| \(.type) | \(.threads) | \(.npp) | \(.npl) | \(.kd | f) | \(.kq | f) | \(.ll | f) |" +
    " \(r(.kd; .ll)) | \(r(.kq; .ll)) | \(.kpp | f) | \(.lpp | f) |")
' "$RES" | tee "$RESULTS.md"
echo "bench_batched: $RES and $RESULTS.md"
