#!/usr/bin/env bash
# The whole long-context matrix in one go (the results' "Decode far past 32K tokens" tables):
# scripts/bench_long.sh over
#   - the SmolLM2-135M shape at 32768, 65536 and 131072 tokens: dense, and at 1/16, 1/32 and
#     1/64 quest as shipped (flat pass, two dense layers), flat quest with every layer sparse,
#     the coarse-to-fine quest and qpredictor (approximate pass over 8-bit metadata);
#   - llama.cpp's llama-server dense at 32768 tokens beside kvpred (part peer);
#   - the disk tier paired against RAM at 131072 tokens for the two coarse-to-fine policies;
#   - the shipped model at the same three contexts (prefilled for real up to 32768);
#   - the Llama-3.2-1B shape at 32768 and 131072 tokens, 1/32.
# About 80 minutes on a 2-core host. Run it on an idle host.
#   scripts/bench_long_matrix.sh [BUILD_DIR]      env: OUT (bench/long_decode_matrix.jsonl),
#                                                 NOTE ("idle host"), WRAP ("nice -n -20")
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
export OUT=${OUT:-bench/long_decode_matrix.jsonl} NOTE=${NOTE:-"idle host"}
export WRAP=${WRAP:-"nice -n -20"} SERVER_PREFIX=${SERVER_PREFIX:-"nice -n -20"}
q="groups=16,coarse=approx,visit=4,q8=1"
aux="--aux models/kvpred-default.qkvpp"
approx="quest approx q8, no dense layers=--policy quest --dense-layers 0 --policy-opts $q"
approx+=";qpredictor approx q8, no dense layers=--policy qpredictor $aux --dense-layers 0"
approx+=" --policy-opts $q"
all="quest=--policy quest;quest flat, no dense layers=--policy quest --dense-layers 0;$approx"
SHAPES=smol135m CTXS="32768 65536 131072" POLICIES="$all" scripts/bench_long.sh "$BUILD" sparse
scripts/bench_long.sh "$BUILD" peer
POLICIES="$approx" scripts/bench_long.sh "$BUILD" disk
SHAPES=default CTXS="32768 65536 131072" POLICIES="$all" scripts/bench_long.sh "$BUILD" sparse
SHAPES=llama1b CTXS="32768 131072" BUDGETS=1/32 POLICIES="$all" scripts/bench_long.sh "$BUILD" sparse
