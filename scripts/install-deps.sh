#!/usr/bin/env bash
# Install the Debian 12 packages kvpred builds and tests with (run as root). Skips apt when
# everything is already installed, so it is cheap to call before every build.
#
# Also installed: the aarch64 cross build scripts/test_arm64.sh runs in CI. Debian's cross
# compiler (gcc-aarch64-linux-gnu), the arm64 builds of the libraries through multiarch (dpkg
# --add-architecture arm64: the same Debian packages, so the same versions as the x86 build) and
# qemu-user, which runs the aarch64 test programs on this machine as ordinary processes
# (`qemu-aarch64 PROGRAM`, no binfmt_misc registration; the programs load libc6:arm64, see
# cmake/aarch64-linux-gnu.cmake). KVP_NO_ARM64=1 skips them.
set -euo pipefail
pkgs=(build-essential cmake pkg-config libopenblas-dev libcjson-dev libpng-dev liburing-dev
      libcmocka-dev clang libclang-rt-14-dev jq libhiredis-dev redis-server redis-tools
      libmicrohttpd-dev curl chromium)
# libmicrohttpd-dev: the HTTP server of `kvpred serve`; curl and chromium (its page, headless):
# the server's tests. Node.js and npm come with the machine; the official openai client is
# installed from npm by scripts/install-node-deps.sh (called below, skipped when unreachable).
arm64=(gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user libopenblas-dev:arm64
       libcjson-dev:arm64 libpng-dev:arm64 liburing-dev:arm64 libcmocka-dev:arm64
       libhiredis-dev:arm64 libmicrohttpd-dev:arm64)
if [ "${KVP_NO_ARM64:-0}" != 1 ] && [ "$(dpkg --print-architecture)" = amd64 ]; then
    pkgs+=("${arm64[@]}")
    if ! dpkg --print-foreign-architectures | grep -qx arm64; then
        dpkg --add-architecture arm64
    fi
fi
missing=()
native="$(dpkg --print-architecture)"
for p in "${pkgs[@]}"; do
    # a library installed for two architectures needs its native one named (dpkg -s refuses
    # the bare name as ambiguous)
    dpkg -s "$p" >/dev/null 2>&1 || dpkg -s "$p:$native" >/dev/null 2>&1 || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
    echo "install-deps: installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
"$(dirname "$0")/install-node-deps.sh" || true
