#!/usr/bin/env bash
# Build the libFuzzer targets with clang in build-fuzz/ and run each for SECONDS (default 30).
#
#   scripts/fuzz.sh [SECONDS]
#
# The seed corpus is generated (build-fuzz/fuzz_seedgen), never checked in; GGUF files under
# ../shared/models are added as extra seeds when present. The working corpus lives in
# build-fuzz/corpus/<target> and grows across runs. Crash reproducers go to
# build-fuzz/artifacts/<target>/. Exits non-zero if any target crashes, leaks or times out.
set -euo pipefail

secs="${1:-30}"
case "$secs" in
    ''|*[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="$root/build-fuzz"
jobs="${KVP_FUZZ_JOBS:-2}"

CC="${CC:-clang}"
case "$CC" in *clang*) ;; *) CC=clang ;; esac
CC="$CC" cmake -S "$root" -B "$build" -DKVP_FUZZ=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null

targets=(fuzz_gguf)
if [ -f "$root/src/model/llama2c.c" ] && compgen -G "$root/src/tokenizer/*.c" >/dev/null; then
    targets+=(fuzz_llama2c)
else
    echo "fuzz.sh: fuzz_llama2c skipped (llama2c / tokenizer sources not present yet)"
fi
cmake --build "$build" -j"$jobs" --target fuzz_seedgen "${targets[@]}"

seeds="$build/seeds"
rm -rf "$seeds"
"$build/fuzz_seedgen" "$seeds"
shared="$root/../shared/models"
if [ -d "$shared" ]; then
    # Extra GGUF seeds, read in place at run time (libFuzzer truncates them to -max_len).
    find "$shared" -maxdepth 2 -name '*.gguf' -size -4M -exec cp {} "$seeds/gguf/" \; || true
fi

status=0
for t in "${targets[@]}"; do
    case "$t" in
        fuzz_gguf) seed_dir="$seeds/gguf" ;;
        fuzz_llama2c) seed_dir="$seeds/llama2c" ;;
    esac
    corpus="$build/corpus/$t"
    artifacts="$build/artifacts/$t"
    mkdir -p "$corpus" "$artifacts"
    echo "fuzz.sh: running $t for ${secs}s"
    if ! "$build/$t" "$corpus" "$seed_dir" \
            -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
            -artifact_prefix="$artifacts/" -print_final_stats=1 2>"$build/$t.log"; then
        echo "fuzz.sh: $t FAILED; see $build/$t.log and $artifacts/" >&2
        tail -n 40 "$build/$t.log" >&2
        status=1
    else
        grep -E '^(stat::number_of_executed_units|Done)' "$build/$t.log" || true
    fi
done
exit "$status"
