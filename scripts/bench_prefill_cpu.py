#!/usr/bin/env python3
"""Prefill CPU time of two kvpred binaries, alternating, per SIMD table and OpenBLAS kernel.

Each run is `kvpred bench -m FILE --prefill N --prefill-only -r REPS -t THREADS --json`; its
CPU time (user + sys of the process, from the kernel's accounting of the finished child) is
steadier on a shared host than the wall time the bench itself reports. The two binaries run
back to back in every round, so both see the same host. One JSON line per run, then one summary
line per (file, prompt, table): the median CPU seconds of each binary and their ratio.

    scripts/bench_prefill_cpu.py --base OLD/kvpred --new build/kvpred FILE.gguf [FILE.gguf ...]

Options: --tables "avx2:Haswell avx512:" (TABLE:OPENBLAS_CORETYPE pairs, empty: OpenBLAS's own
choice), --prompts "512 1000", --rounds 5, --reps 3, --threads 1. Files: e.g. `kvpred synth`'s
(`kvpred synth --shape SmolLM2-135M --layers 6 --type Q8_0 -o smol6.gguf`).
"""
import argparse
import datetime
import json
import os
import platform
import resource
import statistics
import subprocess
import sys


def run_once(binary, path, table, coretype, prompt, reps, threads):
    env = dict(os.environ, KVP_SIMD=table)
    env.pop("OPENBLAS_CORETYPE", None)
    if coretype:
        env["OPENBLAS_CORETYPE"] = coretype
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([binary, "bench", "-m", path, "--prefill", str(prompt), "--prefill-only",
                          "-r", str(reps), "-t", str(threads), "--json"],
                         env=env, capture_output=True, text=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"{binary} failed: {out.stderr.strip()}")
    j = json.loads(out.stdout.strip().splitlines()[-1])
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, j.get("prefill_tokens_per_s")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--base", required=True)
    ap.add_argument("--new", required=True)
    ap.add_argument("--tables", default="avx2:Haswell avx512:")
    ap.add_argument("--prompts", default="512 1000")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("files", nargs="+")
    a = ap.parse_args()
    date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    machine = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            machine = next(l.split(":", 1)[1].strip() for l in f if l.startswith("model name"))
    except (OSError, StopIteration):
        pass
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    cpu = {}
    for r in range(1, a.rounds + 1):
        for path in a.files:
            for prompt in a.prompts.split():
                for tc in a.tables.split():
                    table, _, coretype = tc.partition(":")
                    for name, binary in (("base", a.base), ("new", a.new)):
                        c, tps = run_once(binary, path, table, coretype, int(prompt), a.reps,
                                          a.threads)
                        key = (os.path.basename(path), int(prompt), table, coretype)
                        cpu.setdefault(key, {}).setdefault(name, []).append(c)
                        print(json.dumps({"date": date, "commit": commit, "machine": machine,
                                          "round": r, "binary": name, "file": key[0],
                                          "prompt": key[1], "reps": a.reps,
                                          "threads": a.threads, "table": table,
                                          "openblas_coretype": coretype or "own",
                                          "cpu_s": round(c, 3), "prefill_tokens_per_s": tps}),
                              flush=True)
    for key, v in cpu.items():
        b, n = statistics.median(v["base"]), statistics.median(v["new"])
        print(json.dumps({"summary": True, "date": date, "commit": commit, "machine": machine,
                          "file": key[0], "prompt": key[1], "table": key[2],
                          "openblas_coretype": key[3] or "own", "rounds": a.rounds,
                          "cpu_s_base_median": round(b, 3), "cpu_s_new_median": round(n, 3),
                          "new_over_base": round(n / b, 3)}), flush=True)


if __name__ == "__main__":
    main()
