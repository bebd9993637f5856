#!/bin/bash
# ctest test_function_length: no function of the CLI (src/cli) is longer than 120 lines
# (scripts/check_function_length.py), and the check can fail: a planted function of 121 lines
# is caught, one of 120 passes.
set -u
checker=("${2:-python3}" "$1/scripts/check_function_length.py" --max 120)
"${checker[@]}" "$1/src/cli" || exit 1
planted=$(mktemp -d)
trap 'rm -rf "$planted"' EXIT
write_function() { # planted/f.c: one function of $1 lines, signature to closing brace
    {
        printf '/* planted */\nstatic int planted(int x)\n{\n'
        for ((i = 0; i < $1 - 4; i++)); do printf '    x += %d;\n' "$i"; done
        printf '    return x;\n}\n'
    } >"$planted/f.c"
}
write_function 121
if out=$("${checker[@]}" "$planted") || ! grep -q "planted is 121 lines" <<<"$out"; then
    echo "the check missed a planted function of 121 lines: $out"
    exit 1
fi
echo "planted fault caught: $(head -1 <<<"$out")"
write_function 120
if ! out=$("${checker[@]}" "$planted"); then
    echo "the check refused a function of 120 lines: $out"
    exit 1
fi
echo "a function of 120 lines passes"
