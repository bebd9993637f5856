#!/usr/bin/env bash
# Build kvpred and run the main job: a demo generation on the default model.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"${JOBS:-2}" --target kvpred_cli
./build/kvpred run -p "Once upon a time" -n 200 "$@"
