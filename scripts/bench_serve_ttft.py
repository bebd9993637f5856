#!/usr/bin/env python3
"""`kvpred serve`'s cold time to first token on a long document, sparse prefill against dense.

Starts `kvpred serve` (one slot, no prefix cache) on a model and sends, ROUNDS times, a fresh
document of TOKENS tokens with a question, once with `"kvpred": {"prefill_policy": "dense"}`
and once with `"prefill_policy": "sparse"` (and `prefill_budget`), the order alternating from
round to round (dense first in even rounds, sparse first in odd ones) so that a drift of the
host's speed falls on both alike. Each document starts with a line of its own and the two
modes never share a slot's cache (another prefill attention starts over), so every request is
a cold prefill of the whole prompt. TTFT is the server's `kvpred.ttft_ms` (from the request's
arrival to its first token), with the client's wall time beside it.

    scripts/bench_serve_ttft.py [--kvpred build/kvpred] [--model FILE] [--tokens 32768]
        [--rounds 3] [--threads 2] [--budget 1/16] [--out bench/serve_ttft.jsonl]

Without --model it writes the SmolLM2-135M shape (`kvpred synth --shape SmolLM2-135M`, random
weights, Q8_0) to a temporary folder. The issue's measurement (an idle machine, ~1 h):

    scripts/bench_serve_ttft.py --tokens 32768 --rounds 3 --threads 2 \\
        --out bench/serve_ttft.jsonl

Lines (appended to --out and printed): one per request {"kind": "request", round, mode,
ttft_ms, wall_ms, prompt_tokens, prefix_reused, ...}; one per round {"kind": "round", round,
dense_ttft_ms, sparse_ttft_ms, ratio (dense / sparse)}; last {"kind": "summary", the medians
over rounds and their ratio}; each with date, commit, machine, model, tokens, threads and
budget. A random-weight model's attention is flatter than a trained one's, so the speed is
taken at a stated budget (1/16, as docs/prefill.md's rows).
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import serve_client as sc  # noqa: E402

QUESTION = "\nQuestion: what is the pass key hidden in the text above? Answer:"


def machine():
    cpu = ""
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")),
                       "")
    except OSError:
        pass
    return f"{platform.node()} {cpu or platform.machine()}, {os.cpu_count()} CPUs"


def document(kvpred, model, tokens, i):
    """The i-th passkey document of about `tokens` tokens (the eval's own generator, seed
    1000 + i), the question's room left out, opening with a letter of its own (request i and
    i + 1 never start alike, so nothing but the BOS token is ever reused from a slot)."""
    out = subprocess.run([kvpred, "prompt", "--task", "passkey", "-m", model, "--length",
                          str(tokens - 64), "-c", str(tokens + 256), "--seed", str(1000 + i)],
                         capture_output=True, text=True, check=True, timeout=600).stdout
    tag = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"[i % 26]
    return f"{tag}{tag}{tag} document {i}.\n" + out.rstrip("\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kvpred", default=os.path.join(ROOT, "build", "kvpred"))
    ap.add_argument("--model", default=None, help="GGUF (default: a synth SmolLM2-135M shape)")
    ap.add_argument("--tokens", type=int, default=32768)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--budget", default="1/16", help="the sparse requests' prefill_budget")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "serve_ttft.jsonl"),
                    help="JSON lines appended here ('-': stdout only)")
    a = ap.parse_args()
    if a.rounds > 13:
        sys.exit("bench_serve_ttft: at most 13 rounds (26 documents that start apart)")

    tmp = tempfile.mkdtemp(prefix="kvpred-ttft-")
    server = None
    try:
        model = a.model
        if not model:
            model = os.path.join(tmp, "smollm2-135m.gguf")
            subprocess.run([a.kvpred, "synth", "--shape", "SmolLM2-135M", "-o", model],
                           check=True, capture_output=True, timeout=1200)
        commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                                capture_output=True, text=True).stdout.strip() or "unknown"
        base = {"bench": "serve_ttft",
                "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
                    timespec="seconds"),
                "commit": commit, "machine": machine(),
                "model": os.path.basename(a.model) if a.model else "synth SmolLM2-135M Q8_0",
                "tokens": a.tokens, "threads": a.threads, "budget": a.budget}
        out = None if a.out == "-" else open(a.out, "a")

        def emit(rec):
            line = json.dumps({**base, **rec})
            print(line, flush=True)
            if out:
                out.write(line + "\n")
                out.flush()

        server, port = sc.start(a.kvpred, model, "-np", "1", "-t", a.threads, "--cache-ram", "0",
                                "--max-tokens", "8", "--send-timeout", "3600",
                                ctx=a.tokens + 512)
        modes = {"dense": {"prefill_policy": "dense"},
                 "sparse": {"prefill_policy": "sparse", "prefill_budget": a.budget}}
        per_mode = {"dense": [], "sparse": []}
        for r in range(a.rounds):
            order = ["dense", "sparse"] if r % 2 == 0 else ["sparse", "dense"]
            got = {}
            for k, mode in enumerate(order):
                prompt = document(a.kvpred, model, a.tokens, 2 * r + k) + QUESTION
                body = {"prompt": prompt, "max_tokens": 1, "kvpred": modes[mode]}
                t0 = time.perf_counter()
                st, head, raw = sc.http(port, "POST", "/v1/completions", body, timeout=7200)
                wall = time.perf_counter() - t0
                if st != 200:
                    sys.exit(f"bench_serve_ttft: {mode} request answered {st}: {raw[:300]!r}")
                j = json.loads(raw)
                got[mode] = j["kvpred"]["ttft_ms"]
                per_mode[mode].append(got[mode])
                emit({"kind": "request", "round": r, "mode": mode, "ttft_ms": got[mode],
                      "wall_ms": round(wall * 1e3, 1),
                      "prompt_tokens": j["usage"]["prompt_tokens"],
                      "prefix_reused": j["kvpred"]["prefix_reused"]})
                if j["kvpred"]["prefix_reused"] > 1:
                    sys.exit("bench_serve_ttft: a request reused "
                             f"{j['kvpred']['prefix_reused']} tokens: not a cold prefill")
            emit({"kind": "round", "round": r, "dense_ttft_ms": got["dense"],
                  "sparse_ttft_ms": got["sparse"],
                  "ratio": round(got["dense"] / got["sparse"], 3)})
        d, s = statistics.median(per_mode["dense"]), statistics.median(per_mode["sparse"])
        emit({"kind": "summary", "rounds": a.rounds, "dense_ttft_ms_median": d,
              "sparse_ttft_ms_median": s, "ratio": round(d / s, 3)})
    finally:
        if server:
            rc, err = sc.stop(server)
            if rc != 0:
                print(f"bench_serve_ttft: the server exited {rc}: {err[-500:]}", file=sys.stderr)
        shutil.rmtree(tmp, ignore_errors=True)


main()
