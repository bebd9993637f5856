#!/usr/bin/env python3
"""Answers of `kvpred serve` equal `kvpred run`'s, for retrieval prompts sent by concurrent
clients, before and after a restart with a warm --kv-cache-dir.

Each client i sends the `kvpred prompt --task TASK --length LEN --seed S+i` prompt (and then the
same prompt again, now served from the cached prefix) while the others run; every answer must
be byte-identical to `kvpred run -f PROMPT -n N` (greedy) on the same model and context. Then
the server is restarted on the same folder and every client asks once more. Exits 1 on the
first mismatch, or on a request that was not answered.

  scripts/serve_check_answers.py [--length 8192] [--clients 4] [--slots 2] [--task passkey]
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpred", default=os.path.join(ROOT, "build", "kvpred"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "kvpred-default.gguf"))
    ap.add_argument("--task", default="passkey")
    ap.add_argument("--length", type=int, default=8192)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--slots", type=int, default=2)
    ap.add_argument("--n", type=int, default=24, help="tokens to generate")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--policy", default=None, help="e.g. quest (with --budget)")
    ap.add_argument("--budget", default=None)
    a = ap.parse_args()
    ctx = a.length + a.n + 64
    pol = (["--policy", a.policy] + (["--budget", a.budget] if a.budget else [])) \
        if a.policy else []
    tmp = tempfile.mkdtemp(prefix="serve-check-")
    prompts, wants = [], []
    for i in range(a.clients):
        path = os.path.join(tmp, f"p{i}.txt")
        text = subprocess.run([a.kvpred, "prompt", "--task", a.task, "-m", a.model, "--length",
                               str(a.length), "--seed", str(a.seed + i)], check=True,
                              capture_output=True, text=True).stdout
        with open(path, "w") as f:
            f.write(text)
        out = subprocess.run([a.kvpred, "run", "-m", a.model, "-c", str(ctx), "-f", path, "-n",
                              str(a.n)] + pol, check=True, capture_output=True).stdout
        prompts.append(text)
        wants.append(out[len(text.encode()):-1].decode("utf-8", "replace"))
    cache = os.path.join(tmp, "cache")
    bad = 0

    def serve_round(label, repeats):
        nonlocal bad
        p = subprocess.Popen([a.kvpred, "serve", "-m", a.model, "--port", "0", "-c", str(ctx),
                              "-np", str(a.slots), "--kv-cache-dir", cache] + pol,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        port = int(p.stdout.readline().split()[1])
        got = [[None] * repeats for _ in prompts]

        def client(i):
            for k in range(repeats):
                body = json.dumps({"prompt": prompts[i], "max_tokens": a.n}).encode()
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body)
                with urllib.request.urlopen(req, timeout=1800) as r:
                    j = json.load(r)
                got[i][k] = (j["choices"][0]["text"], j["kvpred"]["prefix_reused"],
                             j["kvpred"].get("ttft_ms"))
        th = [threading.Thread(target=client, args=(i,)) for i in range(len(prompts))]
        for t in th:
            t.start()
        for t in th:
            t.join()
        p.send_signal(signal.SIGTERM)
        p.wait(120)
        for i, rows in enumerate(got):
            for k, row in enumerate(rows):
                ok = row is not None and row[0] == wants[i]
                bad += not ok
                print(f"{label} client {i} request {k}: {'same' if ok else 'DIFFERENT'} "
                      f"(prefix reused {row[1] if row else '-'}, TTFT "
                      f"{row[2] if row and row[2] is not None else '-'} ms)"
                      + ("" if ok else f": {row[0] if row else None!r} vs {wants[i]!r}"),
                      flush=True)

    try:
        serve_round("first run", 2)
        serve_round("after restart", 1)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{3 * a.clients - bad} passed, {bad} failed")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
