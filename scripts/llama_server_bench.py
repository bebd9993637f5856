#!/usr/bin/env python3
"""llama.cpp's llama-server as the peer where llama-bench and llama-batched-bench cannot run.

The llama.cpp peer binaries in ../shared/peers/llama.cpp/bin are built for another CPU: on a host
without its instructions llama-bench and llama-batched-bench die with SIGILL, while the static
llama-server runs. scripts/bench_peers.sh and scripts/bench_batched.sh detect the SIGILL and call
this instead, so a row still has a llama.cpp number; the row says "llama-server" as its engine and
that it stands in for the other tool. Prints one JSON line per measurement.

  pp:      prompt processing of NPP random token ids (the file's vocabulary), one /completion with
           n_predict 1 and cache_prompt false, REPS times: timings.prompt_per_second (the median
           is printed with every run's value).
  batched: for each N in NPL a fresh server with -np N slots and N x (NPP + NTG + 16) cells, in
           two rounds of N concurrent /completion requests with different NPP-token prompts, the
           i-th pinned to slot i (id_slot) with cache_prompt: first n_predict 1, which prefills
           every slot (aggregate prompt = N x NPP / the longest prompt_ms); then the same prompts
           with n_predict NTG, ignore_eos, which find their prompts cached and start decoding
           together: aggregate decode = N x NTG / the longest timings.predicted_ms. In one round
           a slot's predicted_ms would span the other slots' prefills (the server interleaves
           them), which at NPP 4096 cuts the measured decode many times. As llama-batched-bench,
           every sequence is prefilled before any decodes; the cache is per slot.

  llama_server_bench.py --server BIN --model F.gguf --threads T pp --npp 512 --reps 3
  llama_server_bench.py --server BIN --model F.gguf --threads T batched --npp 512 --ntg 64 \
      --npl 1,2,4,8,16
"""
import argparse
import json
import random
import socket
import statistics
import subprocess
import sys
import threading
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/completion",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=1800) as r:
        return json.load(r)


class Server:
    def __init__(self, binary, model, threads, slots, ctx, log):
        self.port = free_port()
        cmd = [binary, "-m", model, "-t", str(threads), "-tb", str(threads), "-np", str(slots),
               "-c", str(ctx), "-b", "2048", "-ub", "512", "--port", str(self.port),
               "--host", "127.0.0.1"]
        self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
        deadline = time.time() + 300
        while time.time() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"llama-server exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=5) as r:
                    if json.load(r).get("status") == "ok":
                        return
            except OSError:
                pass
            time.sleep(0.5)
        self.close()
        raise RuntimeError("llama-server did not become ready in 300 s")

    def close(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def prompt(rng, n, vocab):
    return [rng.randrange(3, vocab) for _ in range(n)]  # past BOS/EOS/UNK-like low ids


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--server", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=512, help="token ids drawn below this")
    ap.add_argument("--log", default="/dev/null", help="the server's output")
    sub = ap.add_subparsers(dest="mode", required=True)
    pp = sub.add_parser("pp")
    pp.add_argument("--npp", type=int, default=512)
    pp.add_argument("--reps", type=int, default=3)
    b = sub.add_parser("batched")
    b.add_argument("--npp", type=int, default=512)
    b.add_argument("--ntg", type=int, default=64)
    b.add_argument("--npl", default="1,2,4,8,16")
    a = ap.parse_args()
    rng = random.Random(1)
    base = {"engine": "llama-server", "stands_in_for": "llama-bench" if a.mode == "pp"
            else "llama-batched-bench", "threads": a.threads}
    with open(a.log, "ab") as log:
        if a.mode == "pp":
            srv = Server(a.server, a.model, a.threads, 1, a.npp + 64, log)
            try:
                post(srv.port, {"prompt": prompt(rng, 16, a.vocab), "n_predict": 1})  # warm-up
                runs = []
                for _ in range(a.reps):
                    r = post(srv.port, {"prompt": prompt(rng, a.npp, a.vocab), "n_predict": 1,
                                        "cache_prompt": False})
                    runs.append(r["timings"]["prompt_per_second"])
            finally:
                srv.close()
            print(json.dumps({**base, "test": f"pp{a.npp}", "npp": a.npp,
                              "tokens_per_s": statistics.median(runs), "runs": runs}))
            return
        for n in [int(x) for x in a.npl.split(",")]:
            srv = Server(a.server, a.model, a.threads, n, n * (a.npp + a.ntg + 16), log)
            try:
                post(srv.port, {"prompt": prompt(rng, 16, a.vocab), "n_predict": 1})  # warm-up
                prompts = [prompt(rng, a.npp, a.vocab) for _ in range(n)]

                def round_of(n_predict):
                    out = [None] * n

                    def one(i):
                        out[i] = post(srv.port, {"prompt": prompts[i], "n_predict": n_predict,
                                                 "ignore_eos": True, "cache_prompt": True,
                                                 "id_slot": i})

                    th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
                    for t in th:
                        t.start()
                    for t in th:
                        t.join()
                    return None if any(o is None for o in out) else [o["timings"] for o in out]

                fill = round_of(1)
                tm = round_of(a.ntg) if fill else None
            finally:
                srv.close()
            if not tm:
                print(f"llama_server_bench: a request failed at npl {n}", file=sys.stderr)
                continue
            pred = sum(t["predicted_n"] for t in tm)
            print(json.dumps({**base, "npp": a.npp, "ntg": a.ntg, "npl": n,
                              "pp_tokens_per_s": n * a.npp / (max(t["prompt_ms"] for t in fill) / 1e3),
                              "tg_tokens_per_s": pred / (max(t["predicted_ms"] for t in tm) / 1e3),
                              "predicted_n": pred,
                              "prompt_n_decode_round": max(t["prompt_n"] for t in tm),
                              "method": "prefill round, then decode round with cached prompts"}))


if __name__ == "__main__":
    main()
