#!/bin/bash
# ctest test_function_length: no function of the CLI (src/cli) is longer than 120 lines
# (scripts/check_function_length.py), and the check can fail: a planted function of 121 lines
# is caught, one of 120 passes.
set -u
src=$1
py=${2:-python3}
check="$py $src/scripts/check_function_length.py --max 120"
$check "$src/src/cli" || exit 1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
plant() { # a file holding one function of $1 lines, signature to closing brace
    {
        echo "/* planted */"
        echo "static int planted(int x)"
        echo "{"
        for ((i = 0; i < $1 - 4; i++)); do echo "    x += $i;"; done
        echo "    return x;"
        echo "}"
    } >"$tmp/planted.c"
}
plant 121
out=$($check "$tmp")
if [ $? -eq 0 ] || ! grep -q "planted is 121 lines" <<<"$out"; then
    echo "the check missed a planted function of 121 lines: $out"
    exit 1
fi
echo "planted fault caught: $(head -1 <<<"$out")"
plant 120
if ! out=$($check "$tmp"); then
    echo "the check refused a function of 120 lines: $out"
    exit 1
fi
echo "a function of 120 lines passes"
