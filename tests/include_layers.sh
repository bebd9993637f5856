#!/bin/bash
# ctest test_include_layers: the source tree keeps docs/architecture.md's include rules
# (scripts/check_includes.py), and the check fails on a planted include loop and on a planted
# upward include and on a planted include of another folder's private header, so it can fail.
set -u
src=$1
py=${2:-python3}
check="$py $src/scripts/check_includes.py"
$check "$src" || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plant() { # copy the tree, apply the planted change, expect the check to fail saying $1
    rm -rf "$tmp/t" && mkdir -p "$tmp/t" && cp -r "$src/src" "$tmp/t/"
    msg=$1
    shift
    "$@"
    out=$($check "$tmp/t")
    if [ $? -eq 0 ] || ! grep -q "$msg" <<<"$out"; then
        echo "the check missed a planted fault ($msg): $out"
        exit 1
    fi
    echo "planted fault caught: $(head -1 <<<"$out")"
}
loop() {
    printf '#include "core/rng.h"\n' >>"$tmp/t/src/core/err.h"
    printf '#include "core/err.h"\n' >>"$tmp/t/src/core/rng.h"
}
upward() { printf '#include "forward/context.h"\n' >>"$tmp/t/src/kv/kvcache.h"; }
private() { printf '#include "store/store_internal.h"\n' >>"$tmp/t/src/eval/measure.c"; }
plant "include loop" loop
plant "is not below" upward
plant "private to src/store" private
