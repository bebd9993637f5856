#!/usr/bin/env bash
# Install the Debian 12 packages kvpred builds and tests with (run as root). Skips apt when
# everything is already installed, so it is cheap to call before every build.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-dev libcjson-dev libpng-dev liburing-dev
      libcmocka-dev clang libclang-rt-14-dev jq libhiredis-dev redis-server redis-tools
      libmicrohttpd-dev curl chromium)
# libmicrohttpd-dev: the HTTP server of `kvpred serve`; curl and chromium (its page, headless):
# the server's tests. Node.js and npm come with the machine; the official openai client is
# installed from npm by scripts/install-node-deps.sh (called below, skipped when unreachable).
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
"$(dirname "$0")/install-node-deps.sh" || true
