#!/usr/bin/env bash
# A busy host on demand: N CPU-bound competitors (each a shell loop that never sleeps, like one
# `stress -c` worker) beside one command, for measuring how kvpred degrades when it does not
# have the machine to itself.
#
#   scripts/busy_host.sh N [-t SECONDS] -- CMD [ARGS...]
#
# Starts N spinning processes at the caller's priority, runs CMD, then kills them (on success,
# failure or Ctrl-C). Bounded: every competitor also exits by itself after SECONDS (default 600),
# so nothing spins on if this script is killed with SIGKILL. Exits with CMD's status.
set -u

usage() { echo "usage: $0 N [-t SECONDS] -- CMD [ARGS...]" >&2; exit 2; }
[ $# -ge 1 ] || usage
n=$1
shift
limit=600
if [ "${1:-}" = "-t" ]; then
    [ $# -ge 2 ] || usage
    limit=$2
    shift 2
fi
[ "${1:-}" = "--" ] || usage
shift
[ $# -ge 1 ] || usage
case $n in '' | *[!0-9]*) usage ;; esac
case $limit in '' | *[!0-9]*) usage ;; esac

pids=()
cleanup() {
    for p in "${pids[@]}"; do
        kill "$p" 2>/dev/null
    done
    for p in "${pids[@]}"; do
        wait "$p" 2>/dev/null
    done
    pids=()
}
trap cleanup EXIT
trap 'exit 130' INT TERM

for ((i = 0; i < n; i++)); do
    # pure user-space arithmetic, no syscalls: the worst kind of neighbour for a thread that
    # needs a core now and then; `timeout` bounds it even if this script dies without its trap
    timeout "$limit" awk 'BEGIN { for (;;) x = (x * 1103515245 + 12345) % 2147483648 }' &
    pids+=($!)
done
"$@"
