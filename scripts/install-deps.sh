#!/usr/bin/env bash
# Install the Debian 12 packages kvpred builds and tests with (run as root). Skips apt when
# everything is already installed, so it is cheap to call before every build.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-dev libcjson-dev libpng-dev liburing-dev
      libcmocka-dev clang libclang-rt-14-dev jq libhiredis-dev redis-server redis-tools)
missing=()
for p in "${pkgs[@]}"; do
    dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
