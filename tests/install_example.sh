#!/usr/bin/env bash
# Installs the build into a scratch prefix, builds the README's C example against the installed
# header and library with `pkg-config --cflags --libs kvpred` only, and runs it on the default
# model. Also checks that the README shows examples/generate.c verbatim.
#   install_example.sh BUILD_DIR CC [EXTRA_CFLAGS]
set -euo pipefail
build="$1"; cc="$2"; extra="${3:-}"
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# The README's example block must be the file the test compiles.
awk '/^<!-- example:begin -->$/{on=1; next} /^<!-- example:end -->$/{on=0} on' "$src/README.md" \
    | sed -e '1{/^```c$/d}' -e '${/^```$/d}' > "$tmp/readme_example.c"
if ! cmp -s "$tmp/readme_example.c" "$src/examples/generate.c"; then
    echo "install_example: README.md's example differs from examples/generate.c" >&2
    diff "$tmp/readme_example.c" "$src/examples/generate.c" >&2 || true
    exit 1
fi

cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
export PKG_CONFIG_PATH="$tmp/prefix/lib/pkgconfig:$tmp/prefix/lib64/pkgconfig:$tmp/prefix/lib/x86_64-linux-gnu/pkgconfig"
flags="$(pkg-config --cflags --libs kvpred)"
# shellcheck disable=SC2086  # word splitting of the flags is intended
"$cc" -std=c11 -Wall -Wextra -Werror $extra "$src/examples/generate.c" -o "$tmp/generate" $flags
# the measuring and tuning header installs beside it and stands on its own
printf '#include <kvpred_lab.h>\nint main(void) { struct kvp_store_stats s = {0}; return (int)s.steps; }\n' \
    >"$tmp/lab.c"
# shellcheck disable=SC2086
"$cc" -std=c11 -Wall -Wextra -Werror $extra "$tmp/lab.c" -o "$tmp/lab" $flags
out="$(cd "$src" && "$tmp/generate" models/kvpred-default.gguf "Once upon a time")"
if [ -z "${out//[[:space:]]/}" ]; then
    echo "install_example: the example generated no text" >&2
    exit 1
fi
if "$tmp/generate" /nonexistent.gguf 2>"$tmp/err"; then
    echo "install_example: a missing model did not fail" >&2
    exit 1
fi
grep -q '^error: ' "$tmp/err"
echo "install_example: built with: $flags"
echo "install_example: generated: $out"
