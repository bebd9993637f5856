#!/usr/bin/env bash
# System calls per decoded token of a `kvpred bench` run, counted by the kernel (perf's
# raw_syscalls tracepoint), only between the bench's reset of the store counters and its read
# of them (two uprobes), so prompt filling is left out. Load-insensitive, unlike wall time.
# Prints the bench's JSON line with "syscalls_per_token" added: {"decode:NAME": n, "other:NAME":
# n, "total": n} ("decode": the thread that called the bench, "other": every other thread;
# clock_gettime is split by clock id: 2 process CPU, 3 thread CPU). With --paired, the counts
# cover both contexts' tokens and are divided by the decoded tokens (n_decode x reps).
#
#   scripts/bench_syscalls.sh BUILD_DIR BENCH_ARGS...     (root, or perf_event_paranoid -1)
#   e.g. scripts/bench_syscalls.sh build -m models/kvpred-default.gguf -t 1 -n 512 -r 1 \
#          --prefill 16 -c 32768 --policy quest --budget 1/16 --kv-tier disk --kv-dir /tmp \
#          --prefetch token --paired --json
set -euo pipefail
[ $# -ge 2 ] || { echo "usage: $0 BUILD_DIR BENCH_ARGS... (with --json)" >&2; exit 2; }
bin=$(realpath "$1/kvpred")
shift
command -v perf >/dev/null || { echo "$0: perf is not installed" >&2; exit 1; }
tmp=$(mktemp -d)
grp=kvpsys$$
cleanup() {
    perf probe -q -d "$grp:*" 2>/dev/null || true
    rm -rf "$tmp"
}
trap cleanup EXIT
perf probe -q -x "$bin" -a "$grp:${grp}_begin=kvp_ctx_store_reset_stats"
perf probe -q -x "$bin" -a "$grp:${grp}_end=kvp_ctx_store_stats"
perf record -q -o "$tmp/perf.data" -e raw_syscalls:sys_enter -e "$grp:*" -- "$bin" bench "$@" \
    >"$tmp/bench.json"
perf script -i "$tmp/perf.data" -F tid,event,trace 2>/dev/null >"$tmp/events.txt"
python3 - "$tmp/bench.json" "$tmp/events.txt" "$grp" <<'EOF'
import collections, json, re, sys
bench = json.loads(open(sys.argv[1]).read())
grp = sys.argv[3]
names = {}
for line in open('/usr/include/x86_64-linux-gnu/asm/unistd_64.h'):
    m = re.match(r'#define __NR_(\w+) (\d+)', line)
    if m:
        names[int(m.group(2))] = m.group(1)
on, main, count = False, None, collections.Counter()
for line in open(sys.argv[2]):
    if grp + '_begin' in line:
        on, main = True, line.split()[0]
        continue
    if grp + '_end' in line:
        on = False
        continue
    m = re.match(r'\s*(\d+)\s.*NR (\d+) \((\w+)', line)
    if not on or not m:
        continue
    name = names.get(int(m.group(2)), m.group(2))
    if name == 'clock_gettime':
        name += '(%d)' % int(m.group(3), 16)
    count[('decode' if m.group(1) == main else 'other', name)] += 1
tokens = bench['n_decode'] * bench['reps']
per = {'%s:%s' % k: round(v / tokens, 3) for k, v in count.most_common()}
per['total'] = round(sum(count.values()) / tokens, 3)
bench['syscalls_per_token'] = per
print(json.dumps(bench))
EOF
