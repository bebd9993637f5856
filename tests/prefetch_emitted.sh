#!/bin/bash
# ctest test_prefetch_emitted: the kernels that read scattered memory (the sparse attention's
# selected blocks, quest's metadata tiles, the mat-vec rows, the batched steps' packed weight
# rows) still contain their software prefetches after optimisation. A compiler may drop them
# without a word: GCC 12's modref pass found that a static helper whose only effect was a
# prefetch had no side effect and removed its calls, which cost the sparse attention at 131072
# tokens 15-20% of its decode speed before the helpers were forced inline. Arguments: the
# library's objects (one ;-separated list, CMake's $<TARGET_OBJECTS>). Exit 77 (skipped) without
# objdump or on an architecture not listed here.
set -u
if ! command -v objdump >/dev/null; then
    [ "${CI:-}" = true ] && { echo "objdump not found (CI=true: a missing input fails the run)"; exit 1; }
    echo "objdump not found: skipped"
    [ -n "${KVP_SKIP_LOG:-}" ] && echo "prefetch_emitted.sh: objdump not found" >>"$KVP_SKIP_LOG"
    exit 77
fi
IFS=';' read -ra objs <<<"$1"
want=(kv/attention.c kv/quest_meta_avx512.c kernels/simd_vnni_avx512.c
      kernels/simd_lanes_vnni_avx512.c)
fail=0
for w in "${want[@]}"; do
    obj=
    for o in "${objs[@]}"; do
        case $o in */$w.o | */$w.obj) obj=$o ;; esac
    done
    if [ -z "$obj" ]; then
        case $w in *avx512*) continue ;; esac # not compiled on this architecture
        echo "no object for $w among the library's objects"
        fail=1
        continue
    fi
    case $(objdump -f "$obj" | sed -n 's/.*architecture: \([^,]*\).*/\1/p') in
    i386:x86-64) insn='prefetch' ;;
    aarch64) insn='prfm' ;;
    *) echo "unknown architecture: skipped"; exit 77 ;;
    esac
    n=$(objdump -d --no-show-raw-insn "$obj" | grep -cw "$insn[a-z0-9]*")
    echo "$w: $n $insn instructions"
    [ "$n" -gt 0 ] || fail=1
done
exit $fail
