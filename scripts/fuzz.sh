#!/usr/bin/env bash
# Build the libFuzzer targets with clang in build-fuzz/ and run each for SECONDS (default 6), one
# after the other: 10 targets x 6 s keeps CI's fuzzing near the minute it took with 2 x 30 s.
#
#   scripts/fuzz.sh [SECONDS]          (scripts/test.sh passes FUZZ_SECONDS)
#
# The seed corpus is generated (build-fuzz/fuzz_seedgen), never checked in; GGUF files under
# ../shared/models, and the predictor files and head profiles under models/, are added as extra
# seeds when present. The working corpus lives in build-fuzz/corpus/<target> and grows across
# runs. Crash reproducers go to build-fuzz/artifacts/<target>/. Exits non-zero if any target
# crashes, leaks or times out. scripts/fuzz_campaign.sh runs the same targets for hours.
set -euo pipefail

secs="${1:-6}"
case "$secs" in
    ''|*[!0-9]*) echo "usage: $0 [SECONDS]" >&2; exit 2 ;;
esac
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/fuzz_targets.sh
. "$root/scripts/fuzz_targets.sh"
build="$root/build-fuzz"
jobs="${KVP_FUZZ_JOBS:-2}"

fuzz_build "$root" "$build" "$jobs"
seeds="$build/seeds"
fuzz_seeds "$root" "$build" "$seeds"

status=0
for t in "${FUZZ_TARGETS[@]}"; do
    corpus="$build/corpus/$t"
    artifacts="$build/artifacts/$t"
    mkdir -p "$corpus" "$artifacts"
    echo "fuzz.sh: running $t for ${secs}s"
    if ! "$build/$t" "$corpus" "$seeds/${t#fuzz_}" -max_total_time="$secs" \
            $(fuzz_flags "$t" "$root") -artifact_prefix="$artifacts/" -print_final_stats=1 \
            2>"$build/$t.log"; then
        echo "fuzz.sh: $t FAILED; see $build/$t.log and $artifacts/" >&2
        tail -n 40 "$build/$t.log" >&2
        status=1
    else
        grep -E '^(stat::number_of_executed_units|Done)' "$build/$t.log" || true
    fi
done
exit "$status"
