#!/usr/bin/env bash
# A fuzzing campaign: every libFuzzer target (scripts/fuzz_targets.sh) runs in parallel, under
# nice -n 10, for the same wall time, on a persistent corpus outside the build tree, then one
# table of the results is printed (Markdown) and written with its JSON twin.
#
#   scripts/fuzz_campaign.sh DURATION [TARGET...]
#
#   DURATION  hours (1, 0.5) or a number with a unit: 90s, 2m, 1h
#   TARGET    fuzz_gguf, fuzz_spm, ... (default: all)
#   FUZZ_CORPUS  corpus root [../kvpred-fuzz-corpus next to the checkout]: <root>/<target>/ is
#                the corpus, <root>/artifacts/<target>/ the crash reproducers, kept across runs
#   FUZZ_REPORT  where the logs and summary.{md,json} go [<corpus root>/reports/<UTC time>]
#
# A target that crashes is restarted on its corpus for the time left (at most 20 times); every
# reproducer written during the campaign counts as a finding. Columns: executions (summed over
# restarts), cov and ft (libFuzzer's final coverage counters: edges and features), the corpus
# (files, bytes) at the end, and findings. Exits 1 when there is any finding.
set -euo pipefail

usage() { echo "usage: $0 DURATION [TARGET...]   (DURATION: hours, or 90s / 2m / 1h)" >&2; exit 2; }
[ $# -ge 1 ] || usage
dur="$1"
shift
case "$dur" in
    *s) secs="${dur%s}" ;;
    *m) secs="$(awk -v m="${dur%m}" 'BEGIN { printf "%d", m * 60 }')" ;;
    *h) secs="$(awk -v h="${dur%h}" 'BEGIN { printf "%d", h * 3600 }')" ;;
    *) secs="$(awk -v h="$dur" 'BEGIN { printf "%d", h * 3600 }')" ;;
esac
case "$secs" in ''|*[!0-9]*|0) usage ;; esac

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=scripts/fuzz_targets.sh
. "$root/scripts/fuzz_targets.sh"
targets=("${FUZZ_TARGETS[@]}")
[ $# -gt 0 ] && targets=("$@")
build="$root/build-fuzz"
corpus_root="${FUZZ_CORPUS:-$(dirname "$root")/kvpred-fuzz-corpus}"
report="${FUZZ_REPORT:-$corpus_root/reports/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$corpus_root" "$report"

fuzz_build "$root" "$build" "${KVP_FUZZ_JOBS:-2}" >/dev/null
seeds="$build/seeds"
fuzz_seeds "$root" "$build" "$seeds"

# run_target NAME: fuzz until the deadline, restarting after a crash.
run_target() {
    local t="$1" end=$(( $(date +%s) + secs )) tries=0
    local corpus="$corpus_root/$t" artifacts="$corpus_root/artifacts/$t" log="$report/$t.log"
    mkdir -p "$corpus" "$artifacts"
    : >"$log"
    while :; do
        local left=$(( end - $(date +%s) ))
        [ "$left" -ge 1 ] && [ "$tries" -lt 20 ] || break
        tries=$((tries + 1))
        # shellcheck disable=SC2046
        nice -n 10 "$build/$t" "$corpus" "$seeds/${t#fuzz_}" -max_total_time="$left" \
            $(fuzz_flags "$t" "$root") -artifact_prefix="$artifacts/" -print_final_stats=1 \
            >>"$log" 2>&1 || echo "fuzz_campaign: $t stopped with status $? (restart $tries)" >>"$log"
    done
}

stamp="$report/.start"
touch "$stamp"
: >"$report/findings.txt"
echo "fuzz_campaign: ${#targets[@]} targets for ${secs}s each, in parallel; corpus $corpus_root," \
     "logs $report" >&2
pids=()
for t in "${targets[@]}"; do
    [ -x "$build/$t" ] || { echo "fuzz_campaign: no target $t" >&2; exit 2; }
    run_target "$t" &
    pids+=("$!")
done
for p in "${pids[@]}"; do wait "$p"; done

# The table, from each log and the corpus and artifact folders.
md="$report/summary.md"
json="$report/summary.json"
total=0
{
    echo "| target | executions | cov | ft | corpus files | corpus KiB | findings |"
    echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"
} >"$md"
printf '{"seconds_per_target": %d, "targets": [' "$secs" >"$json"
sep=""
for t in "${targets[@]}"; do
    log="$report/$t.log"
    execs="$(awk '/^stat::number_of_executed_units/ { s += $NF } END { print s + 0 }' "$log")"
    read -r cov ft < <(awk '/ cov: [0-9]+ ft: [0-9]+/ {
            for (i = 1; i < NF; i++) { if ($i == "cov:") c = $(i + 1); if ($i == "ft:") f = $(i + 1) }
        } END { print c + 0, f + 0 }' "$log")
    files="$(find "$corpus_root/$t" -type f | wc -l)"
    kib="$(find "$corpus_root/$t" -type f -printf '%s\n' | awk '{ s += $1 } END { printf "%d", s / 1024 }')"
    find "$corpus_root/artifacts/$t" -type f -newer "$stamp" >>"$report/findings.txt"
    found="$(find "$corpus_root/artifacts/$t" -type f -newer "$stamp" | wc -l)"
    total=$((total + found))
    echo "| $t | $execs | $cov | $ft | $files | $kib | $found |" >>"$md"
    printf '%s{"target": "%s", "executions": %d, "cov": %d, "ft": %d, "corpus_files": %d, "corpus_kib": %d, "findings": %d}' \
        "$sep" "$t" "$execs" "$cov" "$ft" "$files" "$kib" "$found" >>"$json"
    sep=", "
done
printf '], "findings": %d}\n' "$total" >>"$json"
rm -f "$stamp"
cat "$md"
echo "fuzz_campaign: $total findings; summary in $md and $json" >&2
if [ "$total" -gt 0 ]; then
    echo "fuzz_campaign: reproducers:" >&2
    cat "$report/findings.txt" >&2
    exit 1
fi
