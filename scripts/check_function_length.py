#!/usr/bin/env python3
"""Checks that no C function in the given folders is longer than a limit (default 120 lines).

A function's length counts from the first line of its signature to its closing brace, both
included. The tree is formatted by .clang-format (Linux braces), so a function body opens with
a "{" alone at column 0 and closes with a "}" at column 0; anything else at column 0 between
them cannot be, so the scan needs no C parser.

usage: check_function_length.py [--max N] [--list] PATH...   (PATH: a .c file or a folder)
Prints one line per function over the limit and exits 1 if there is any; --list prints every
function's length, longest first.
"""
import argparse
import os
import re
import sys

NAME_BEFORE_PAREN = re.compile(r"([A-Za-z_][A-Za-z0-9_]*)\s*\(")


def signature_start(lines, brace):
    """Index of the first line of the signature above the body's opening brace at `brace`."""
    i = brace - 1
    while i > 0:
        above = lines[i - 1].rstrip()
        if (not above or above.endswith((";", "}", "*/")) or above.startswith(("#", "//"))):
            break
        i -= 1
    return i


def functions(path):
    """(name, first line, length) of every function defined in the file at `path`."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    found = []
    i = 0
    while i < len(lines):
        if lines[i].rstrip() != "{":
            i += 1
            continue
        start = signature_start(lines, i)
        end = i + 1
        while end < len(lines) and not lines[end].startswith("}"):
            end += 1
        if end == len(lines):
            raise SystemExit(f"{path}:{i + 1}: no closing brace at column 0 for this body")
        signature = " ".join(lines[start:i])
        match = NAME_BEFORE_PAREN.search(signature)
        name = match.group(1) if match else signature.strip()
        found.append((name, start + 1, end - start + 1))
        i = end + 1
    return found


def c_files(paths):
    for path in paths:
        if os.path.isfile(path):
            yield path
            continue
        for root, dirs, files in os.walk(path):
            dirs.sort()
            for name in sorted(files):
                if name.endswith(".c"):
                    yield os.path.join(root, name)


def main():
    ap = argparse.ArgumentParser(description="no C function longer than --max lines")
    ap.add_argument("--max", type=int, default=120, help="longest allowed function (lines)")
    ap.add_argument("--list", action="store_true", help="print every function, longest first")
    ap.add_argument("paths", nargs="+")
    args = ap.parse_args()
    rows = [(length, f"{path}:{line}", name) for path in c_files(args.paths)
            for name, line, length in functions(path)]
    rows.sort(key=lambda r: (-r[0], r[1]))
    if args.list:
        for length, where, name in rows:
            print(f"{length:5d} {where} {name}")
        return 0
    over = [r for r in rows if r[0] > args.max]
    for length, where, name in over:
        print(f"{where}: {name} is {length} lines (at most {args.max})")
    print(f"{len(rows)} functions read, {len(over)} over {args.max} lines")
    return 1 if over else 0


if __name__ == "__main__":
    sys.exit(main())
