#!/usr/bin/env python3
"""Serving benchmark: `kvpred serve` against llama.cpp's `llama-server`, same model file, same
slots and per-slot context, in alternation, under the multi-turn shared-context load of SCBench:
every client sends a long document with a first question, then follow-up questions about the
same document (the document is the prompt's prefix each time), then, after the server is
restarted, one more.

Per server and client count it reports time to first token (cold: the first question; warm: the
follow-ups; restart: the question after a restart), per-request decode tokens/s (tokens after
the first over the time after the first), aggregate decode tokens/s (all generated tokens of the
warm phase over its wall time), each as p50 and p99, and the server's peak RSS (VmHWM). One
JSON line per (server, clients, round) goes to --out, and a Markdown table of the medians over
rounds to --table.

Documents are `kvpred prompt --task passkey` texts of --doc-tokens tokens (distinct seeds per
client), so both servers read the same text; streamed /v1/completions, greedy, --max-tokens each.
kvpred runs with --policy/--budget (default quest 1/16) and --kv-cache-dir (so a restart keeps
the prefixes); llama-server with its defaults (dense attention, prompt cache in the slot),
-c slots x ctx (it divides -c among its slots) and --cache-reuse 256.

Example (the idle-machine run; see docs/server.md):
  kvpred synth --shape SmolLM2-135M --type Q8_0 -o /tmp/smol.gguf
  scripts/bench_serve.py --model /tmp/smol.gguf --clients 4,8 --slots 4 --ctx 6144 \\
      --doc-tokens 4096 --threads 2 --rounds 2 --out bench/serve_smollm2.jsonl \\
      --table bench/serve_smollm2.md
"""
import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def pct(xs, q):
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


class Server:
    """One server process; start() waits until /health answers."""

    def __init__(self, kind, a, cache_dir):
        self.kind, self.a, self.cache_dir, self.p = kind, a, cache_dir, None

    def start(self):
        self.port = free_port()
        a = self.a
        if self.kind == "kvpred":
            cmd = [a.kvpred, "serve", "-m", a.model, "--port", str(self.port), "-np",
                   str(a.slots), "-c", str(a.ctx), "-t", str(a.threads), "--n-predict",
                   str(a.max_tokens), "--kv-cache-dir", self.cache_dir,
                   "--queue", str(4 * max(a.clients_list))]
            if a.policy:
                cmd += ["--policy", a.policy, "--budget", a.budget]
        else:
            cmd = [a.llama_server, "-m", a.model, "--port", str(self.port), "--host",
                   "127.0.0.1", "-np", str(a.slots), "-c", str(a.slots * a.ctx), "-t",
                   str(a.threads), "--cache-reuse", "256", "--no-webui"]
        self.log = open(os.path.join(self.cache_dir, f"{self.kind}.log"), "a")
        self.p = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT)
        t0 = time.time()
        while time.time() - t0 < 300:
            if self.p.poll() is not None:
                raise RuntimeError(f"{self.kind} exited: see {self.log.name}")
            try:
                st, _ = request(self.port, "GET", "/health", None, timeout=2)
                if st == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.kind} did not come up")

    def peak_rss_mib(self):
        try:
            with open(f"/proc/{self.p.pid}/status") as f:
                for line in f:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) / 1024
        except OSError:
            return None

    def stop(self):
        if self.p and self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(60)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait()
        self.log.close()


def request(port, method, path, body, timeout=600):
    import http.client
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=json.dumps(body) if body is not None else None,
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, data


def stream(port, prompt, max_tokens, timeout=1800):
    """One streamed completion: (ttft s, decode tok/s or None, tokens, t_start, t_end).

    Time to first token is the request's wall time on the client minus the decode time the
    server reports (from its first token to its last: kvpred's "kvpred.decode_ms", llama-server's
    "timings.predicted_ms"), so it covers the wait for a slot and the prefill whatever the text
    looks like. The first streamed text is not a usable mark on a random-weight model: both
    servers hold back bytes that do not yet make whole UTF-8 characters, and llama-server drops
    an unfinished tail at the end, so a whole answer may stream no text at all. Where a server
    reports no decode time, the first text event is used."""
    import http.client
    body = {"prompt": prompt, "max_tokens": max_tokens, "stream": True, "temperature": 0,
            "cache_prompt": True, "stream_options": {"include_usage": True}}
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    t0 = time.time()
    c.request("POST", "/v1/completions", body=json.dumps(body),
              headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"HTTP {r.status}: {r.read()[:200]!r}")
    t_first = t_last = None
    n = 0
    usage = None
    decode_ms = None
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            ev, buf = buf.split(b"\n\n", 1)
            if not ev.startswith(b"data: ") or ev == b"data: [DONE]":
                continue
            j = json.loads(ev[6:])
            if j.get("usage"):
                usage = j["usage"]
            if (j.get("kvpred") or {}).get("decode_ms") is not None:
                decode_ms = j["kvpred"]["decode_ms"]
            if (j.get("timings") or {}).get("predicted_ms") is not None:
                decode_ms = j["timings"]["predicted_ms"]
            for ch in j.get("choices", []):
                if ch.get("text"):
                    now = time.time()
                    t_first = t_first or now
                    t_last = now
                    n += 1  # events, not tokens: usage (below) counts the tokens
    c.close()
    t_end = time.time()
    tokens = usage["completion_tokens"] if usage else n
    if decode_ms is not None and tokens >= 1:
        ttft = (t_end - t0) - decode_ms / 1e3
        tps = (tokens - 1) / (decode_ms / 1e3) if tokens > 1 and decode_ms > 0 else None
        return ttft, tps, tokens, t0, t_end
    tps = (tokens - 1) / (t_last - t_first) if t_first and t_last > t_first and tokens > 1 \
        else None
    return (t_first - t0 if t_first else None), tps, tokens, t0, t_end


def run_round(kind, a, clients, docs, rnd, out):
    d = tempfile.mkdtemp(prefix=f"bench-serve-{kind}-")
    srv = Server(kind, a, d)
    res = {"cold": [], "warm": [], "restart": [], "tps": []}
    warm_tokens = [0]
    lock = threading.Lock()
    try:
        srv.start()

        def client(i, phase):
            doc = docs[i]
            if phase == "first":
                ttft, tps, n, _, _ = stream(srv.port, doc, a.max_tokens)
                with lock:
                    res["cold"].append(ttft)
                    res["tps"].append(tps)
            elif phase == "follow":
                for k in range(a.followups):
                    q = f"\nQuestion {k + 2}: what was said about the pass key, part {k + 2}?"
                    ttft, tps, n, _, _ = stream(srv.port, doc + q, a.max_tokens)
                    with lock:
                        res["warm"].append(ttft)
                        res["tps"].append(tps)
                        warm_tokens[0] += n
            else:
                q = "\nQuestion after a restart: what is the pass key?"
                ttft, tps, n, _, _ = stream(srv.port, doc + q, a.max_tokens)
                with lock:
                    res["restart"].append(ttft)

        def phase(name):
            th = [threading.Thread(target=client, args=(i, name)) for i in range(clients)]
            t0 = time.time()
            for t in th:
                t.start()
            for t in th:
                t.join()
            return time.time() - t0

        phase("first")
        warm_wall = phase("follow")
        rss = srv.peak_rss_mib()
        if kind not in a.no_restart:
            srv.stop()
            srv = Server(kind, a, d)
            srv.start()
            phase("restart")
            rss = max(rss or 0, srv.peak_rss_mib() or 0)
    finally:
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)
    tps = [x for x in res["tps"] if x]
    row = {
        "server": kind, "clients": clients, "round": rnd, "slots": a.slots, "ctx": a.ctx,
        "doc_tokens": a.doc_tokens, "followups": a.followups, "max_tokens": a.max_tokens,
        "threads": a.threads, "model": os.path.basename(a.model),
        "policy": (f"{a.policy} {a.budget}" if a.policy else "full") if kind == "kvpred"
        else "llama.cpp default",
        "ttft_cold_p50_s": pct(res["cold"], 0.5), "ttft_cold_p99_s": pct(res["cold"], 0.99),
        "ttft_warm_p50_s": pct(res["warm"], 0.5), "ttft_warm_p99_s": pct(res["warm"], 0.99),
        "ttft_restart_p50_s": pct(res["restart"], 0.5),
        "ttft_restart_p99_s": pct(res["restart"], 0.99),
        "decode_tps_p50": pct(tps, 0.5), "decode_tps_p99": pct(tps, 0.01),  # p99 = slowest 1 %
        "aggregate_decode_tps": warm_tokens[0] / warm_wall if warm_wall > 0 else None,
        "peak_rss_mib": rss,
    }
    if a.note:
        row["note"] = a.note
    out.write(json.dumps(row) + "\n")
    out.flush()
    print(json.dumps(row), flush=True)
    return row


def table(rows):
    def med(key, rs):
        xs = [r[key] for r in rs if r.get(key) is not None]
        return statistics.median(xs) if xs else None

    def f(x, unit=""):
        return "-" if x is None else (f"{x:.3f}{unit}" if x < 10 else f"{x:.0f}{unit}")
    lines = ["| server | clients | TTFT cold p50 | warm p50 / p99 | after restart p50 | "
             "warm/cold | decode tok/s p50 / p99 | aggregate tok/s | peak RSS MiB |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    keys = sorted({(r["clients"], r["server"]) for r in rows})
    for clients, server in keys:
        rs = [r for r in rows if r["clients"] == clients and r["server"] == server]
        cold, warm = med("ttft_cold_p50_s", rs), med("ttft_warm_p50_s", rs)
        ratio = warm / cold if cold and warm else None
        lines.append(
            f"| {server} ({rs[0]['policy']}) | {clients} | {f(cold, ' s')} | "
            f"{f(warm, ' s')} / {f(med('ttft_warm_p99_s', rs), ' s')} | "
            f"{f(med('ttft_restart_p50_s', rs), ' s')} | {f(ratio)} | "
            f"{f(med('decode_tps_p50', rs))} / {f(med('decode_tps_p99', rs))} | "
            f"{f(med('aggregate_decode_tps', rs))} | {f(med('peak_rss_mib', rs))} |")
    return "\n".join(lines) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", required=True)
    ap.add_argument("--kvpred", default=os.path.join(ROOT, "build", "kvpred"))
    ap.add_argument("--llama-server",
                    default=os.path.join(ROOT, "..", "shared", "peers", "llama.cpp", "bin",
                                         "llama-server"))
    ap.add_argument("--servers", default="kvpred,llama", help="which, in this order")
    ap.add_argument("--clients", default="4,8")
    ap.add_argument("--slots", type=int, default=4)
    ap.add_argument("--ctx", type=int, default=6144, help="context per slot")
    ap.add_argument("--doc-tokens", type=int, default=4096)
    ap.add_argument("--followups", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--policy", default="quest")
    ap.add_argument("--budget", default="1/16")
    ap.add_argument("--rounds", type=int, default=1, help="alternations of the servers")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "serve.jsonl"))
    ap.add_argument("--table", default=None, help="Markdown table file (default: print)")
    ap.add_argument("--no-restart", default="",
                    help="servers whose restart phase is skipped (comma-separated): llama-server "
                         "keeps nothing across a restart, so its restart TTFT is its cold one "
                         "again and costs as long to measure")
    ap.add_argument("--note", default=None,
                    help="how the run was taken (priority, lock, load), kept in every row")
    a = ap.parse_args()
    a.clients_list = [int(x) for x in a.clients.split(",")]
    a.no_restart = [x for x in a.no_restart.split(",") if x]
    servers = [s for s in a.servers.split(",") if s]
    if "llama" in servers and not os.access(a.llama_server, os.X_OK):
        print(f"bench_serve: no llama-server at {a.llama_server}; running kvpred only")
        servers.remove("llama")
    docs = []
    for i in range(max(a.clients_list)):
        r = subprocess.run([a.kvpred, "prompt", "--task", "passkey", "-m", a.model, "--length",
                            str(a.doc_tokens), "--seed", str(1000 + i)],
                           capture_output=True, text=True, check=True)
        docs.append(r.stdout)
    rows = []
    with open(a.out, "a") as out:
        for rnd in range(a.rounds):
            for clients in a.clients_list:
                for kind in servers:
                    rows.append(run_round(kind, a, clients, docs, rnd, out))
    t = table(rows)
    if a.table:
        with open(a.table, "w") as f:
            f.write(t)
    print(t)


if __name__ == "__main__":
    main()
