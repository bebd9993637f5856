#!/usr/bin/env bash
# Install the npm packages the server tests drive `kvpred serve` with into tests/node_modules
# (git-ignored): the official `openai` client and playwright-core (the page test drives Debian's
# /usr/bin/chromium with it; no browser is downloaded). Cheap when already there; exits 0 with a
# message when npm or its registry cannot be reached, and the tests that need them then skip.
set -uo pipefail
dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/../tests" && pwd)"
if ! command -v npm >/dev/null 2>&1; then
    echo "install-node-deps: npm not found; the openai-client and page tests will skip"
    exit 0
fi
if [ -d "$dir/node_modules/openai" ] && [ -d "$dir/node_modules/playwright-core" ]; then
    exit 0
fi
cd "$dir"
if ! PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD=1 timeout 300 npm install --no-save --no-audit --no-fund \
        --loglevel=error --prefix "$dir" openai@4 playwright-core >/dev/null 2>&1; then
    echo "install-node-deps: npm install failed (registry unreachable?); the openai-client and" \
         "page tests will skip"
fi
exit 0
