#!/usr/bin/env python3
"""ctest test_server_arch: `kvpred serve` on models with sliding-window layers and a policy.

Two files written by `kvpred synth` with random weights of real shapes, cut to a few layers:
Gemma 3 1B's (six layers: five local with a window of 512, one global) and Gemma 2 2B's (two:
one local, one global with soft-capped scores). Each is served with quest at 1/4 as the default
policy; a prompt longer than Gemma 3's window (so its local layers' rings wrap), the same
prompt under snapkv (an evicting policy, chosen by the request), and a follow-up that starts
with the first prompt (prefix reuse) must each generate exactly what `kvpred run` generates with
the same policy and greedy sampling (the server runs the same kvp_eval calls: no tolerance); and
on Gemma 2 a chat request, which takes the family's template as `kvpred run --chat` does (the
synthetic file has none of its own).
Under the sanitizers (ARCH_QUICK=1, set by CMake) Gemma 3's snapkv check is left out.

usage: test_server_arch.py KVPRED_BINARY   (exit 0: passed)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_client  # noqa: E402
from serve_client import check, http, passed, stop  # noqa: E402

KVPRED = sys.argv[1]
CTX = 1024


def synth(shape, layers, path):
    subprocess.run([KVPRED, "synth", "--shape", shape, "--layers", str(layers), "--type", "Q8_0",
                    "--seed", "3", "-t", "2", "-o", path], check=True, capture_output=True,
                   timeout=600)


def start(model, *extra):
    return serve_client.start(KVPRED, model, "--timeout", "30", "-t", "2", *extra, ctx=CTX)


def complete(port, body):
    status, head, raw = http(port, "POST", "/v1/completions", body, timeout=600)
    if status != 200:
        print("completion failed:", head, raw[:200])
        sys.exit(1)
    return json.loads(raw)


def run_cli(model, prompt, n, policy, budget):
    args = [KVPRED, "run", "-m", model, "-c", str(CTX), "-p", prompt, "-n", str(n), "--temp",
            "0", "-t", "2", "--policy", policy, "--budget", budget]
    out = subprocess.run(args, capture_output=True, timeout=600).stdout
    assert out.startswith(prompt.encode()), out[:80]  # run echoes the prompt, then the answer
    return out[len(prompt.encode()):-1].decode("utf-8", "replace")


def serve_checks(model, name, snapkv=True, chat=False):
    # longer than Gemma 3's window of 512 positions in tokens (the synthetic vocabulary is
    # letters and bytes: about a token a character)
    doc = " ".join(f"item {i} is a small red box;" for i in range(30))
    follow = doc + " which item is blue?"
    p, port = start(model, "--policy", "quest", "--budget", "1/4")
    try:
        got = complete(port, {"prompt": doc, "max_tokens": 8, "temperature": 0})
        toks = got["usage"]["prompt_tokens"]
        want = run_cli(model, doc, 8, "quest", "1/4")
        check(got["choices"][0]["text"] == want,
              f"{name}: quest 1/4 (the server's default) on a {toks}-token prompt equals "
              f"kvpred run")
        if snapkv:
            got = complete(port, {"prompt": doc, "max_tokens": 8, "temperature": 0,
                                  "kvpred": {"policy": "snapkv", "budget": "1/4"}})
            check(got["choices"][0]["text"] == run_cli(model, doc, 8, "snapkv", "1/4"),
                  f"{name}: snapkv 1/4 by the request (evicting on the global layers) equals "
                  f"kvpred run")
        got = complete(port, {"prompt": follow, "max_tokens": 8, "temperature": 0})
        check(got["choices"][0]["text"] == run_cli(model, follow, 8, "quest", "1/4"),
              f"{name}: follow-up (prefix reused: {got['kvpred'].get('prefix_reused')} tokens) "
              f"equals kvpred run")
        if chat:
            # a synthetic file has no chat template: the server must take the family's format
            # as `kvpred run --chat` does (Gemma's turns), not plain text
            q = "which item is blue?"
            out = subprocess.run([KVPRED, "run", "-m", model, "-c", str(CTX), "-p", q, "-n", "8",
                                  "--temp", "0", "-t", "2", "--policy", "quest", "--budget",
                                  "1/4", "--chat"], capture_output=True, timeout=600).stdout
            status, _, raw = http(port, "POST", "/v1/chat/completions",
                                  {"messages": [{"role": "user", "content": q}],
                                   "max_tokens": 8, "temperature": 0}, timeout=600)
            text = json.loads(raw)["choices"][0]["message"]["content"] if status == 200 else None
            check(out.startswith(b"<start_of_turn>user") and text is not None
                  and out.endswith(text.encode() + b"\n"),
                  f"{name}: a chat request takes the family's template as kvpred run --chat "
                  f"does ({status})")
    finally:
        stop(p)
    return toks


def main():
    tmp = tempfile.mkdtemp(prefix="kvp_srv_arch_")
    try:
        g3, g2 = os.path.join(tmp, "gemma3.gguf"), os.path.join(tmp, "gemma2.gguf")
        synth("Gemma-3-1B", 6, g3)
        synth("Gemma-2-2B", 2, g2)
        # under the sanitizers (ARCH_QUICK=1: the slowest test there, a prefill of ~850 tokens
        # taking about a minute) Gemma 3's snapkv check is left to the release run; Gemma 2's
        # runs everywhere, so the sanitizers still see an evicting policy beside a local layer
        quick = os.environ.get("ARCH_QUICK") == "1"
        toks = serve_checks(g3, "Gemma 3 (6 layers, window 512)", snapkv=not quick)
        check(toks > 512, f"the prompt ({toks} tokens) is longer than the window")
        serve_checks(g2, "Gemma 2 (2 layers, soft-capped global layer)", chat=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed()} passed, 0 failed")


main()
