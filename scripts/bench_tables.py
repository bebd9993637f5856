#!/usr/bin/env python3
"""The tables of bench/README.md, made from the JSON lines in bench/ (nothing typed by hand).

usage: scripts/bench_tables.py [--check]          write bench/README.md (--check: exit 1 if stale)
       scripts/bench_tables.py --stamp FILE [--commit C] [--date D]
           add date, commit and machine (this host's CPU model, flags, cores) to every record of
           FILE that lacks them: run it on a new result file right after the run that made it.

Each current result file holds JSON lines (or one JSON object) whose records carry `date`,
`commit` and `machine`; the tables say which file, commit, date, machine and command they come
from. Superseded results live in bench/history/ and are not read here.
"""
import collections
import fractions
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
BENCH = os.path.join(ROOT, "bench")
FLAGS_OF_INTEREST = ("fma", "f16c", "avx2", "bmi2", "avx512f", "avx512bw", "avx512vl",
                     "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "asimd", "sve")


def machine_here():
    cpu, flags = "unknown", []
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key == "model name" and cpu == "unknown":
                    cpu = val.strip()
                elif key in ("flags", "Features") and not flags:
                    have = set(val.split())
                    flags = [x for x in FLAGS_OF_INTEREST if x in have]
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "flags": " ".join(flags)}


def load(name):
    """Records of bench/NAME: JSON lines, or one JSON object."""
    path = os.path.join(BENCH, name)
    with open(path) as f:
        text = f.read()
    if name.endswith(".json"):
        return [json.loads(text)]
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def stamp(path, commit, date):
    recs_text = open(path).read()
    machine = machine_here()
    if path.endswith(".json"):
        o = json.loads(recs_text, object_pairs_hook=collections.OrderedDict)
        for k, v in (("date", date), ("commit", commit), ("machine", machine)):
            o.setdefault(k, v)
        out = json.dumps(o, indent=1, ensure_ascii=False) + "\n"
    else:
        lines = []
        for line in recs_text.splitlines():
            if not line.strip():
                continue
            o = json.loads(line, object_pairs_hook=collections.OrderedDict)
            for k, v in (("date", date), ("commit", commit), ("machine", machine)):
                o.setdefault(k, v)
            lines.append(json.dumps(o, ensure_ascii=False))
        out = "\n".join(lines) + "\n"
    with open(path, "w") as f:
        f.write(out)


def provenance(recs, name, command):
    dates = sorted({r.get("date", "?")[:16].replace("T", " ") for r in recs})
    commits = sorted({r.get("commit", "?") for r in recs})
    m = recs[0].get("machine", {})
    when = dates[0] if len(dates) == 1 else f"{dates[0]} to {dates[-1]}"
    # the benchmark scripts write the machine as one line of text, the stamped files as fields
    where = m if isinstance(m, str) else \
        f"{m.get('cpu', '?')}, {m.get('cores', '?')} cores, {m.get('flags', '?')}"
    return (f"Data: `bench/{name}` (committed {when} UTC, {', '.join(commits)}); machine: "
            f"{where}.\n"
            f"Remake: `{command}`\n")


def table(head, rows):
    out = ["| " + " | ".join(head) + " |",
           "|" + "|".join("---" if i == 0 else "---:" for i in range(len(head))) + "|"]
    out += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(out) + "\n"


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def fmt(x, nd=1):
    return f"{x:.{nd}f}" if isinstance(x, (int, float)) and x == x else "—"


def span(xs, nd=3):
    xs = sorted(xs)
    if not xs:
        return "—"
    return fmt(xs[0], nd) if fmt(xs[0], nd) == fmt(xs[-1], nd) else f"{fmt(xs[0], nd)}-{fmt(xs[-1], nd)}"


# ---- the tables ------------------------------------------------------------------------------

def peers(headline=False, name="peers_llamacpp.jsonl",
          command="OUT=/tmp/kvp-bench-peers scripts/bench_peers.sh"):
    if not os.path.exists(os.path.join(BENCH, name)):
        return "(no data yet)\n", ""
    recs = load(name)
    by = collections.defaultdict(list)
    for r in recs:
        by[(r["shape"], r["layers"], r["type"], r["test"], r["threads"], r["engine"], r["run"])].append(
            r["tokens_per_s"])
    keys = sorted({k[:5] for k in by}, key=lambda k: (k[0], k[2], k[4], k[3]))
    rows = []
    for k in keys:
        kv = [x for run in (1, 2) for x in by.get(k + ("kvpred", run), [])]
        ll = [x for run in (1, 2) for x in by.get(k + ("llama.cpp", run), [])]
        test = k[3]
        if "quest" in test:  # llama.cpp has no sparse mode: compare with its dense decode
            ll = [x for run in (1, 2) for x in by.get(k[:3] + (test.split()[0] + " dense", k[4], "llama.cpp", run), [])]
        per_run = []
        for run in (1, 2):
            a = by.get(k + ("kvpred", run), [])
            b = by.get(k + ("llama.cpp", run), []) if "quest" not in test else \
                by.get(k[:3] + (test.split()[0] + " dense", k[4], "llama.cpp", run), [])
            if a and b:
                per_run.append(med(a) / med(b))
        ratio = med(kv) / med(ll) if kv and ll else float("nan")
        if headline and not (test in ("pp512", "tg128 @512") and k[2] in ("Q8_0", "Q4_K")
                             or test.startswith("tg@16384")):
            continue
        rows.append([f"{k[0]} ({k[1]} layers)", k[2], test.replace("tg@", "decode @").replace(
            "tg128 @512", "tg128 @512"), k[4], fmt(med(kv)), fmt(med(ll)) if ll else "—",
            fmt(ratio, 2) + "×", " / ".join(fmt(x, 2) + "×" for x in per_run)])
    head = ["shape (layers)", "type", "test", "threads", "kvpred tok/s", "llama.cpp tok/s",
            "ratio", "ratio run 1 / run 2"]
    return table(head, rows), provenance(recs, name, command)


def retrieval():
    name = "qpredictor_tasks_8192_seed7.jsonl"
    recs = load(name)
    acc = collections.defaultdict(lambda: [0.0, 0])
    for r in recs:
        a = acc[(r["policy"], r["budget"], r["task"])]
        a[0] += r["accuracy"] * r["samples"]
        a[1] += r["samples"]
    tasks = sorted({r["task"] for r in recs})
    order = {"quest": 0, "oracle": 1, "qpredictor": 2}
    keys = sorted({(r["policy"], r["budget"]) for r in recs},
                  key=lambda k: (order.get(k[0], 9), k[0], -eval_ratio(k[1])))
    rows = [[p, b, acc[(p, b, tasks[0])][1]] + [fmt(100 * acc[(p, b, t)][0] / acc[(p, b, t)][1], 0) + " %"
            for t in tasks] for p, b in keys]
    return (table(["policy", "budget", "prompts per task"] + tasks, rows),
            provenance(recs, name, "SAMPLES=10 BASELINES=quest,oracle PART=tasks "
                       "scripts/eval_qpredictor.sh build"))


def eval_ratio(b):
    try:
        n, d = b.split("/")
        return float(n) / float(d)
    except ValueError:
        return 1.0


def tasks_all(length=8192):
    name = "tasks_kvpred-default.jsonl"
    recs = [r for r in load(name) if r["length"] == length]
    acc = collections.defaultdict(lambda: [0.0, 0])
    for r in recs:
        a = acc[(r["policy"], r["budget"], r["task"])]
        a[0] += r["accuracy"] * r["samples"]
        a[1] += r["samples"]
    tasks = sorted({r["task"] for r in recs})
    seen, keys = set(), []
    for r in recs:
        k = (r["policy"], r["budget"])
        if k not in seen:
            seen.add(k)
            keys.append(k)
    rows = [[p, b, acc[(p, b, tasks[0])][1]] + [fmt(100 * acc[(p, b, t)][0] / acc[(p, b, t)][1], 0) + " %"
            for t in tasks] for p, b in keys]
    return (table(["policy", "budget", "prompts per task"] + tasks, rows),
            provenance(recs, name, "POLICY_SAMPLES=2 scripts/eval_tasks.sh build"))


def recovery():
    name = "qpredictor_stories260K.jsonl"
    recs = load(name)
    pols = []
    for r in recs:
        if r["policy"] not in pols:
            pols.append(r["policy"])
    budgets = sorted({r["budget"] for r in recs}, key=int)
    val = {(r["policy"], r["budget"]): r["recovery"] for r in recs}
    rows = [[b] + [fmt(val.get((p, b), float("nan")), 4) for p in pols] for b in budgets]
    return (table(["budget (tokens)"] + pols, rows),
            provenance(recs, name, "PART=stories scripts/eval_qpredictor.sh build"))


def policy_share():
    name = "policy_share_idle.jsonl"
    recs = [r for r in load(name) if r.get("binary") == "current"]
    by = collections.defaultdict(list)
    for r in recs:
        by[(r["ctx"], r["policy"])].append(r)
    rows = []
    for (ctx, pol), rs in sorted(by.items()):
        rows.append([ctx, pol, len(rs), span([r["policy_share"] for r in rs]),
                     span([r["policy_ms_per_token"] for r in rs]),
                     span([r["decode_ms_per_token"] for r in rs])])
    return (table(["ctx", "policy", "runs", "policy_share", "hooks ms / token", "decode ms / token"], rows),
            provenance(recs, name, "kvpred bench -m models/kvpred-default.gguf -t 1 -c CTX -n 64 "
                       "--prefill 16 --policy P --budget 1/16 --aux FILE --json"))


def long_decode(name="long_decode.jsonl",
                command="WRAP=\"flock LOCK nice -n -20\" scripts/bench_long.sh build sparse disk peer"):
    recs = load(name)
    last = collections.OrderedDict()  # the latest record of each run (re-runs supersede)
    for r in recs:
        last[(r["part"], r["shape"], r["ctx"] if r["part"] != "peer" else r.get("peer_ctx", r["ctx"]),
              r["label"], r.get("budget"))] = r
    layers = {"smol135m": "SmolLM2-135M shape, Q8_0, 30 layers",
              "llama1b": "Llama-3.2-1B shape, Q8_0", "default": "shipped model (2 of 4 layers dense)"}
    dense = {(k[1], k[2]): r for k, r in last.items() if k[0] == "sparse" and k[3] == "dense"}
    rows = []
    order = {"dense": 0}
    for k, r in sorted(((k, r) for k, r in last.items() if k[0] == "sparse"),
                       key=lambda kr: (list(layers).index(kr[0][1]) if kr[0][1] in layers else 9,
                                       kr[0][2], order.get(kr[0][3], 1),
                                       -float(fractions.Fraction(kr[0][4] or "1")), kr[0][3])):
        d = dense.get((k[1], k[2]))
        tps = r["decode_tokens_per_s"]
        mb = lambda x: fmt(x / 1e6, 1)
        rows.append([layers.get(k[1], k[1]), k[2], k[3], r.get("budget") or "—", fmt(tps, 2),
                     fmt(tps / d["decode_tokens_per_s"], 1) + "×" if d else "—",
                     fmt(r.get("policy_share", float("nan")), 3),
                     fmt(r.get("policy_cpu_share", float("nan")), 3),
                     fmt(r.get("policy_ms_per_token", float("nan")), 2),
                     mb(r["weight_bytes"]), mb(r.get("kv_read_bytes_per_token", float("nan"))),
                     mb(r.get("meta_flat_bytes_per_token", float("nan"))),
                     fmt(r.get("read_floor_tokens_per_s", float("nan")), 1),
                     f"{r.get('fill', 'prefill')} {fmt(r['fill_seconds'], 0)} s"])
    out = table(["model", "ctx", "policy", "budget", "decode tok/s", "÷ dense", "policy_share",
                 "policy_cpu_share", "hooks ms/token", "weights MB", "KV read MB/token",
                 "flat meta MB/token", "read floor tok/s", "fill"], rows)
    disk = [(k, r) for k, r in last.items() if k[0] == "disk"]
    if disk:
        rows = []
        for k, r in disk:
            st, pa = r["store"], r["paired"]
            rows.append([layers.get(k[1], k[1]), k[2], k[3], r.get("budget"),
                         fmt(r["decode_tokens_per_s"], 2), fmt(pa["ram_tokens_per_s"], 2),
                         fmt(pa["ratio"], 2) + "×", fmt(100 * st["hit_rate"], 1) + " %",
                         fmt(st["wait_ms"], 2),
                         fmt(st["hot_bytes"] / 1e6, 0) + " MB of " + fmt(r["kv_bytes_at_ctx"] / 1e6, 0)])
        out += "\nDisk tier (token prefetch) paired against RAM sparse (`--paired`):\n\n" + table(
            ["model", "ctx", "policy", "budget", "disk tok/s", "RAM tok/s", "disk ÷ RAM, paired",
             "hit rate", "wait ms/token", "hot tier (RAM) of KV"], rows)
    peer = [(k, r) for k, r in last.items() if k[0] == "peer"]
    if peer:
        llama = [r for k, r in peer if k[3].startswith("llama.cpp")]
        base = llama[-1]["decode_tokens_per_s"] if llama else float("nan")
        rows = [[layers.get(k[1], k[1]), k[2], k[3], r.get("budget") or "—",
                 fmt(r["decode_tokens_per_s"], 2), fmt(r["decode_tokens_per_s"] / base, 2) + "×"]
                for k, r in peer]
        out += "\nAgainst llama.cpp (`llama-server`, dense, f16 KV, one alternating run):\n\n" + table(
            ["model", "ctx", "engine / policy", "budget", "decode tok/s", "÷ llama.cpp"], rows)
    return out, provenance(recs, name, command)


def store_paired(headline=False):
    name = "store_paired_idle.jsonl"
    recs = load(name)
    by = collections.defaultdict(list)
    for r in recs:
        by[(r["ctx"], r["policy"])].append(r)
    rows = []
    for (ctx, pol), rs in sorted(by.items()):
        rows.append([ctx, pol, len(rs), span([100 * r["store"]["hit_rate"] for r in rs], 1) + " %",
                     span([r["store"]["wait_ms"] for r in rs]),
                     span([r["decode_tokens_per_s"] for r in rs], 0),
                     span([r["paired"]["ram_tokens_per_s"] for r in rs], 0),
                     span([r["paired"]["ratio"] for r in rs], 2) + "×",
                     fmt(rs[0]["store"]["hot_bytes"] / 1e6, 1) + " MB"])
    head = ["ctx", "policy", "runs", "hit rate", "wait ms / token", "disk tok/s", "RAM tok/s",
            "disk ÷ RAM, paired", "hot tier"]
    return table(head, rows), provenance(
        recs, name, "kvpred bench -m models/kvpred-default.gguf -t 1 -n 512 -r 1 --prefill 16 -c CTX "
        "--policy P --budget 1/16 [--aux models/kvpred-default.qkvpp] --kv-tier disk --kv-dir /tmp "
        "--prefetch token --paired --json")


def store_redis():
    name = "store_redis_idle.jsonl"
    recs = load(name)
    by = collections.defaultdict(list)
    for r in recs:
        by[(r["setup"], r["ctx"])].append(r)
    rows = [[s, c, len(rs), span([r["decode_tokens_per_s"] for r in rs], 0),
             span([r["paired"]["ram_tokens_per_s"] for r in rs], 0),
             span([r["paired"]["ratio_median"] for r in rs], 2) + "×",
             span([100 * r["store"]["hit_rate"] for r in rs], 1) + " %"]
            for (s, c), rs in sorted(by.items())]
    head = ["setup", "ctx", "runs", "redis tok/s", "RAM tok/s", "redis ÷ RAM, paired (median)", "hit rate"]
    return table(head, rows), provenance(recs, name, "see docs/store.md, \"Measuring the Redis tier\"")


def store_busy():
    name = "store_busy_host.jsonl"
    recs = load(name)
    by = collections.defaultdict(list)
    for r in recs:
        by[(r["competitors"], r["ctx"])].append(r)
    rows = [[c, ctx, len(rs), span([r["paired"]["ratio_median"] for r in rs], 2) + "×",
             span([r["paired"]["ratio"] for r in rs], 2) + "×",
             span([r["store"]["wait_ms"] for r in rs], 2)]
            for (c, ctx), rs in sorted(by.items())]
    head = ["CPU-bound competitors", "ctx", "runs", "disk ÷ RAM (median of chunks)", "(total)", "wait ms / token"]
    return table(head, rows), provenance(recs, name, "env N=512 REPEAT=1 scripts/bench_busy_host.sh build")


def matvec():
    name = "matvec_bw.jsonl"
    recs = load(name)
    by = {(r["type"], r["cols"], r["threads"]): r for r in recs}
    keys = []
    for r in recs:
        if (r["type"], r["cols"]) not in keys:
            keys.append((r["type"], r["cols"]))
    rows = []
    for t, c in keys:
        row = [t, c]
        for th in (1, 2):
            r = by.get((t, c, th))
            row += [f"{fmt(r['matvec_gb_s'])} ({fmt(r['read_gb_s'])})", fmt(r["ratio"], 2)] if r else ["—", "—"]
        rows.append(row)
    head = ["type", "columns", "1 thread GB/s (read)", "ratio", "2 threads GB/s (read)", "ratio"]
    return table(head, rows), provenance(recs, name, "build/matvec_bw [--threads 2] TYPE:COLS ...")


def engine_toy():
    name = "engine_stories260K.jsonl"
    recs = [r for r in load(name) if r.get("binary") == "current"]
    by = collections.defaultdict(list)
    for r in recs:
        by[(r["ctx"], r["threads"])].append(r)
    rows = [[ctx, th, span([r["prefill_tokens_per_s"] for r in rs], 0),
             span([r["decode_tokens_per_s"] for r in rs], 0)] for (ctx, th), rs in sorted(by.items())]
    return (table(["ctx", "threads", "prefill tok/s", "decode tok/s"], rows),
            provenance(recs, name, "kvpred bench -m ../shared/models/stories260K.gguf -c CTX -n 256 "
                       "-t T -r 5 -ctk f32 -ctv f32 --json"))


def acceptance():
    name = "acceptance_kvpred-default.jsonl"
    recs = load(name)
    acc = collections.defaultdict(lambda: [0.0, 0])
    for r in recs:
        col = r["task"] + (" (prose)" if "pg_essays" in (r.get("filler") or "") and r["task"] == "passkey" else "")
        a = acc[(r["seed"], r["length"], col)]
        a[0] += r["accuracy"] * r["samples"]
        a[1] += r["samples"]
    cols = sorted({k[2] for k in acc})
    keys = sorted({k[:2] for k in acc})
    rows = [[s, length] + [fmt(100 * acc[(s, length, c)][0] / acc[(s, length, c)][1], 0) + " %"
            if acc[(s, length, c)][1] else "—" for c in cols] for s, length in keys]
    return (table(["seed", "length"] + cols, rows),
            provenance(recs, name, "scripts/eval_acceptance.sh build"))


def multi_question(name="multi_question_kvpred-default_8192.jsonl"):
    recs = load(name)
    tasks, rows = [], collections.OrderedDict()
    for r in recs:
        if r["task"] not in tasks:
            tasks.append(r["task"])
        row = rows.setdefault((r["policy"], r["budget"], r["follow_up"]),
                              {"server": r["server_follow_up"], "acc": {}})
        row["acc"].setdefault(r["task"], {})[r["question"]] = r["accuracy"]
    out = []
    for (pol, budget, follow), v in rows.items():
        cells = []
        for t in tasks:
            qs = v["acc"].get(t, {})
            cells.append(" / ".join(fmt(100 * qs[q], 0) for q in sorted(qs)) if qs else "—")
        out.append([pol, budget, follow, v["server"]] + cells)
    docs = sorted({r["documents"] for r in recs})
    nq = sorted({r["questions"] for r in recs})
    lengths = sorted({r["length"] for r in recs})
    return (table(["policy", "budget", "follow-up", "kvpred serve does"]
                  + [f"{t}: q1 / … / q{nq[-1]} (%)" for t in tasks], out),
            provenance(recs, name, "scripts/eval_multi_question.sh build (LENGTHS=%s DOCS=%s "
                       "QUESTIONS=%s)" % (",".join(map(str, lengths)),
                                          ",".join(map(str, docs)), ",".join(map(str, nq)))))


def train_speed():
    rows, provs = [], []
    for name, label, env in (("train_speed_idle.json", "OPENBLAS_CORETYPE=Haswell",
                              "OPENBLAS_CORETYPE=Haswell "),
                             ("train_speed_idle_blas_auto.json", "OpenBLAS's own kernel choice",
                              "env -u OPENBLAS_CORETYPE ")):
        rec = load(name)[0]
        res = {(r["ctx"], r["precision"]): r for r in rec["results"]}
        for ctx in sorted({r["ctx"] for r in rec["results"]}):
            f, b = res.get((ctx, "f32")), res.get((ctx, "bf16"))
            if f and b:
                rows.append([ctx, label, f["tokens_per_s_median"], b["tokens_per_s_median"],
                             fmt(b["tokens_per_s_median"] / f["tokens_per_s_median"], 2) + "×",
                             f["cpu_s_per_mtok_median"], b["cpu_s_per_mtok_median"]])
        provs.append(provenance([rec], name, env + "kvpred train-lm --bench --bench-ctx 2048,8192 --dim 128 "
                                "--layers 4 --heads 4 --kv-heads 2 --ff 352 --vocab 1024 --threads 2"))
    head = ["ctx", "f32 reference", "f32 tok/s", "bf16 tok/s", "bf16 ÷ f32", "f32 CPU s / Mtok",
            "bf16 CPU s / Mtok"]
    return table(head, rows), "".join(provs)


def serving():
    name = "serve_smollm2.jsonl"
    recs = load(name)
    rows = []
    by = collections.OrderedDict()
    for r in recs:
        by.setdefault((r["clients"], r["server"]), []).append(r)
    for (clients, server), rs in sorted(by.items()):
        cold = med([r["ttft_cold_p50_s"] for r in rs if r.get("ttft_cold_p50_s") is not None])
        warm = med([r["ttft_warm_p50_s"] for r in rs if r.get("ttft_warm_p50_s") is not None])
        rest = [r["ttft_restart_p50_s"] for r in rs if r.get("ttft_restart_p50_s") is not None]
        restart = med(rest) if rest else None
        agg = med([r["aggregate_decode_tps"] for r in rs])
        other = [x for (c, sv), xs in by.items() if c == clients and sv != server for x in xs]
        ratio = agg / med([x["aggregate_decode_tps"] for x in other]) if other else None
        rows.append([f"{'kvpred' if server == 'kvpred' else 'llama-server'} ({rs[0]['policy']})",
                     clients, fmt(cold, 1), fmt(warm, 2), fmt(warm / cold, 3),
                     fmt(restart, 2) if restart is not None else "not run",
                     fmt(restart / cold, 3) if restart is not None else "—",
                     f"{fmt(med([r['decode_tps_p50'] for r in rs]))} / "
                     f"{fmt(med([r['decode_tps_p99'] for r in rs]))}",
                     fmt(agg), f"{fmt(ratio, 2)}×" if ratio and server == "kvpred" else "",
                     fmt(med([r["peak_rss_mib"] for r in rs]), 0)])
    head = ["server", "clients", "TTFT cold s", "follow-up s", "follow-up / cold",
            "after restart s", "restart / cold", "decode tok/s p50 / p99", "aggregate tok/s",
            "vs llama-server", "peak RSS MiB"]
    return table(head, rows), provenance(
        recs, name, "kvpred synth --shape SmolLM2-135M --type Q8_0 -o smol.gguf; per clients "
        "value C: flock bench.lock nice -n -20 scripts/bench_serve.py --model smol.gguf "
        "--clients C --slots 4 --ctx 6144 --doc-tokens 4096 --followups 3 --max-tokens 64 "
        "--threads 2 --rounds 1 [--no-restart llama at 8] --out bench/serve_smollm2.jsonl")

def batched(name="batched.jsonl",
            cmd="scripts/bench_batched.sh (kvpred batched-bench -npp N -ntg N -npl 1,2,4,8,16 -t 2 "
                "--fill copy; llama-server standing in for llama-batched-bench, which dies of SIGILL "
                "on this CPU: scripts/llama_server_bench.py)"):
    """bench/batched.jsonl: kvpred batched-bench (and the llama.cpp peer that ran) per npl."""
    if not os.path.exists(os.path.join(BENCH, name)):
        return "(no data yet)\n", ""
    recs = load(name)
    by = collections.defaultdict(list)
    for r in recs:
        key = (r.get("engine", "kvpred"), r.get("type") or r.get("weight_type"), r.get("kv", "dense"),
               r["threads"], r["npp"], r.get("ntg"))
        by[key].append(r)
    npls = sorted({r["npl"] for r in recs})
    rows = []
    for key in sorted(by, key=lambda k: (k[1], k[4], k[3], k[0] != "kvpred", k[2])):
        eng, ty, kv, th, npp, ntg = key
        tg = {}
        for r in by[key]:
            tg.setdefault(r["npl"], []).append(r["tg_tokens_per_s"])
        cells = [fmt(statistics.median(tg[n]), 0) if n in tg else "" for n in npls]
        one = statistics.median(tg[1]) if 1 in tg else None
        eight = statistics.median(tg[8]) if 8 in tg else None
        ratio = fmt(eight / one, 2) + "×" if one and eight else ""
        # against the best aggregate the llama.cpp peer's dense decode reaches at any npl (the
        # same type, threads, npp, ntg): medians per npl, then their maximum
        peer = collections.defaultdict(list)
        for k, rs in by.items():
            if k[0] != "kvpred" and k[1:] == (ty, "dense", th, npp, ntg):
                for r in rs:
                    peer[r["npl"]].append(r["tg_tokens_per_s"])
        best = max((statistics.median(v) for v in peer.values()), default=None)
        vs = fmt(eight / best, 2) + "×" if eng == "kvpred" and eight and best else ""
        rows.append([eng, ty, kv, th, npp, ntg] + cells + [ratio, vs])
    head = ["engine", "type", "KV", "threads", "npp", "ntg"] + [f"npl {n} tg tok/s" for n in npls] \
        + ["npl 8 ÷ npl 1", "npl 8 ÷ peer's best npl"]
    return table(head, rows), provenance(recs, name, cmd)


def batched_disk(name="batched_disk.jsonl"):
    """bench/batched_disk.jsonl: many long contexts on the disk tier (bench_batched_disk.sh)."""
    if not os.path.exists(os.path.join(BENCH, name)):
        return "(no data yet)\n", ""
    recs = load(name)
    rows = []
    gib = 1024 ** 3
    for r in recs:
        ser = r.get("tg_serial_tokens_per_s")
        kv = "dense" if r["policy"] == "dense" else f"{r['policy']} {r['budget']}"
        io = ""
        if r["kv_tier"] == "disk":
            io = ("syscall submission" if "--kv-syscall-submit" in r["command"]
                  else "polling thread per ring")
            io += ", prefetch none" if "--prefetch none" in r["command"] else ", token prefetch"
        host = "idle" if "host otherwise idle" in r.get("note", "") else "loaded"
        rps = r.get("cold_reads_per_token", 0) * r["tg_tokens_per_s"]
        rows.append([r["commit"], host, r["kv_tier"], io, kv, r["npl"], r["npp"], r["ntg"],
                     fmt(r["tg_tokens_per_s"], 1), fmt(ser, 1),
                     fmt(r["tg_tokens_per_s"] / ser, 2) + "×" if ser else "",
                     fmt(r["kv_resident_bytes"] / gib, 2), fmt(r["kv_cold_bytes"] / gib, 2),
                     fmt(r["rss_bytes"] / gib, 2),
                     fmt(r["cold_bytes_read_per_token"] / 2 ** 20, 1),
                     fmt(r.get("serial_cold_bytes_read_per_token", float("nan")) / 2 ** 20, 1),
                     fmt(100 * r["cold_hits"] / (r["cold_hits"] + r["cold_misses"]), 0) + " %"
                     if r.get("cold_hits", 0) + r.get("cold_misses", 0) else "",
                     fmt(rps, 0) if rps else ""])
    head = ["commit", "host", "tier", "disk I/O", "KV", "npl", "npp", "ntg", "batched tg tok/s", "one after another tok/s",
            "batched ÷ serial", "KV in RAM GiB", "KV cold GiB", "RSS GiB",
            "MiB read / token (batched)", "MiB read / token (serial)", "hot-tier hits",
            "cold reads / s"]
    cmds = sorted({r["command"] for r in recs})
    return table(head, rows), provenance(recs, name, "scripts/bench_batched_disk.sh (" +
                                         "; ".join(cmds) + ")")


def peers_server():
    """bench/peers_llamaserver.jsonl: bench_peers.sh where llama-server stands in."""
    name = "peers_llamaserver.jsonl"
    if not os.path.exists(os.path.join(BENCH, name)):
        return "(no data yet)\n", ""
    recs = load(name)
    by = collections.defaultdict(lambda: collections.defaultdict(list))
    for r in recs:
        by[(r["shape"], r["layers"], r["type"], r["test"], r["threads"])][r["engine"]].append(
            r["tokens_per_s"])
    rows = []
    for (sh, ly, ty, test, th), e in sorted(by.items()):
        k, l = med(e["kvpred"]), med(e["llama.cpp"])
        rows.append([f"{sh} ({ly} layers)", ty, test, th, fmt(k), fmt(l), fmt(k / l, 2) + "×"])
    head = ["shape", "type", "test", "threads", "kvpred tok/s", "llama-server tok/s", "ratio"]
    return table(head, rows), provenance(
        recs, name, "REPS=3 SHAPES=l1b TYPES=Q4_K THREADS=2 LONG=\"\" scripts/bench_peers.sh")


def prefill_long(name="prefill_long.jsonl"):
    if not os.path.exists(os.path.join(BENCH, name)):
        return "(no data yet)\n", ""
    recs = load(name)
    by = collections.defaultdict(list)
    for r in recs:
        key = "kvpred" if r["engine"] == "kvpred" else \
            ("llama fa" if r.get("flash_attn") else "llama")
        by[(r["prompt_tokens"], key)].append(r["prefill_tokens_per_s"])
    rows = []
    for n in sorted({k[0] for k in by}):
        kv, ll, fa = by.get((n, "kvpred"), []), by.get((n, "llama"), []), by.get((n, "llama fa"), [])
        ratio = med(kv) / med(ll) if kv and ll else float("nan")
        rows.append([n, span(kv, 1), span(ll, 1), span(fa, 1), fmt(ratio, 2) + "×"])
    head = ["prompt tokens", "kvpred tok/s", "llama.cpp tok/s", "llama.cpp, flash attention",
            "ratio (medians, no flash attention)"]
    return table(head, rows), provenance(
        recs, name, "scripts/bench_prefill_long.sh build (each record has its command)")


def prefill_sparse(name="prefill_sparse.jsonl"):
    if not os.path.exists(os.path.join(BENCH, name)):
        return "(no data yet: `scripts/bench_prefill_sparse.sh`)\n", ""
    recs = load(name)
    by = collections.defaultdict(list)
    for r in recs:
        if r["engine"] == "kvpred":
            key = "dense" if r["policy"] == "dense" else "sparse"
        else:
            key = "llama fa" if r.get("flash_attn") else "llama"
        by[(r["prompt_tokens"], key)].append(r)
    rows = []
    for n in sorted({k[0] for k in by}):
        d, sp = by.get((n, "dense"), []), by.get((n, "sparse"), [])
        ll = [r["prefill_tokens_per_s"] for r in by.get((n, "llama"), []) + by.get((n, "llama fa"), [])]
        rate = lambda rs: [r["prefill_tokens_per_s"] for r in rs]
        share = lambda rs, f: [r[f] for r in rs if r.get(f) is not None]
        best_ll = max(ll) if ll else float("nan")
        rows.append([n, span(rate(d), 1), span(share(d, "attention_share"), 2),
                     span(rate(sp), 1), ", ".join(sorted({str(r.get("budget")) for r in sp})) or "—",
                     span(share(sp, "density"), 3), span(share(sp, "attention_share"), 2),
                     span(share(sp, "estimate_share"), 3),
                     span(rate(by.get((n, "llama"), [])), 1),
                     span(rate(by.get((n, "llama fa"), [])), 1),
                     fmt(med(rate(sp)) / med(rate(d)), 2) + "×" if d and sp else "—",
                     fmt(med(rate(sp)) / best_ll, 2) + "×" if sp and ll else "—",
                     fmt(n / med(rate(sp)), 0) if sp else "—"])
    head = ["prompt tokens", "dense tok/s", "dense attention share", "sparse tok/s", "budget",
            "density", "sparse attention share", "estimate / attention",
            "llama.cpp tok/s", "llama.cpp, flash attention", "sparse / dense",
            "sparse / llama.cpp best", "sparse seconds"]
    return table(head, rows), provenance(
        recs, name, "scripts/bench_prefill_sparse.sh build (each record has its command)")


def prefill_sparse_quality(name="prefill_sparse_quality.jsonl"):
    if not os.path.exists(os.path.join(BENCH, name)):
        return "(no data yet: `scripts/quality_prefill_sparse.sh`)\n", ""
    recs = load(name)
    acc = collections.defaultdict(lambda: [0.0, 0])
    dens = {}
    for r in recs:
        if "task" not in r:
            continue
        k = (r["task"], r["length"], r["policy"] + " " + r["budget"], r["prefill_arm"])
        acc[k][0] += r["accuracy"] * r["samples"]
        acc[k][1] += r["samples"]
        if r["prefill_arm"] == "sparse":
            dens[k[:3]] = r.get("prefill_density")
    rows = []
    for k in sorted({k[:3] for k in acc}):
        dn, sp = acc.get(k + ("dense",)), acc.get(k + ("sparse",))
        a = lambda v: 100 * v[0] / v[1] if v and v[1] else float("nan")
        rows.append([k[0], k[1], k[2], fmt(dens.get(k), 3), fmt(a(dn), 1), fmt(a(sp), 1),
                     fmt(a(sp) - a(dn), 1), (dn or [0, 0])[1]])
    head = ["task", "tokens", "decode", "sparse density", "dense prefill %", "sparse prefill %",
            "points", "prompts"]
    kl = [[r.get("prefill_budget"), fmt(r.get("prefill_density"), 3), f"{r['kl']:.2e}",
           fmt(r["ppl_ratio"], 4)] for r in recs if "task" not in r]
    out = table(head, rows)
    if kl:
        out += "\nHeld-out text after a sparse prefill (the reference dense):\n\n" + table(
            ["prefill budget", "density", "KL", "perplexity ratio"], kl)
    return out, provenance(recs, name, "scripts/quality_prefill_sparse.sh build")



def long_decode_real(name="long_decode_real.jsonl"):
    """Decode after one real (sparse) prefill per length, several policies from that cache."""
    if not os.path.exists(os.path.join(BENCH, name)):
        return "(no data yet: `scripts/bench_long.sh build real`)\n", ""
    recs = load(name)
    last = collections.OrderedDict()  # re-runs supersede
    for r in recs:
        last[(r["shape"], r["ctx"], r["label"], r.get("budget"))] = r
    dense = {(k[0], k[1]): r for k, r in last.items() if k[2] == "dense"}
    rows = []
    for k, r in sorted(last.items(), key=lambda kr: (kr[0][0], kr[0][1], kr[1]["policy_index"])):
        d = dense.get((k[0], k[1]))
        tps = r["decode_tokens_per_s"]
        rows.append([k[0], k[1], k[2], r.get("budget") or "—", fmt(tps, 2),
                     fmt(tps / d["decode_tokens_per_s"], 1) + "×" if d else "—",
                     fmt(r.get("policy_share", float("nan")), 3),
                     f"{r.get('prefill_policy', '?')} {r.get('prefill_budget') or ''}".strip(),
                     fmt(r.get("fill_density", float("nan")), 3), fmt(r["fill_seconds"], 0)])
    head = ["model", "ctx", "policy", "budget", "decode tok/s", "÷ dense", "policy_share",
            "prefill", "prefill density", "fill s"]
    return table(head, rows), provenance(
        recs, name, "scripts/bench_long.sh build real (each record has its command)")


def arch_summary(name):
    """The summary objects bench_arch*.sh runs end with, their rows merged."""
    path = os.path.join(BENCH, name)
    if not os.path.exists(path):
        return None
    lines = [json.loads(x) for x in open(path).read().splitlines() if x.strip()]
    summ = [x for x in lines if "summary" in x and "rows" in x]
    if not summ:
        return None
    # a later run's row supersedes an earlier one's (a rerun of some rows keeps the others)
    rows = collections.OrderedDict()
    for x in summ:
        for r in x["rows"]:
            rows[tuple(str(r.get(k)) for k in ("shape", "type", "row", "policy", "layers"))] = \
                dict(r, date=x["date"], commit=x["commit"])
    return dict(summ[-1], rows=list(rows.values()), runs=summ)


def arch_peers(name="arch_peers.json"):
    s = arch_summary(name)
    if not s:
        return "(no data yet: `scripts/bench_arch.sh`)\n", ""
    rows = [[r["shape"], r["type"], r["row"], fmt(r["kvpred"], 2), fmt(r["llama_cpp"], 2),
             fmt(r["ratio"], 2) + "×" if r.get("ratio") else "—", r["date"][:10], r["commit"]]
            for r in sorted(s["rows"], key=lambda r: (r["shape"], r["type"], r["row"]))]
    recs = [{"date": x["date"], "commit": x["commit"], "machine": x["machine"]} for x in s["runs"]]
    return table(["shape", "weights", "test", "kvpred tok/s", "llama.cpp tok/s", "ratio", "date",
                  "commit"], rows), provenance(
        recs, name, "REPS=5 TG=64 scripts/bench_arch.sh (each row from the latest run that has it)")


def arch_policies(name="arch_policies.json"):
    s = arch_summary(name)
    if not s:
        return "(no data yet: `scripts/bench_arch_policies.sh`)\n", ""
    keys = [k for k in s["rows"][0] if k not in ("shape", "policy", "date", "commit")]
    rows = [[r["shape"], r["policy"]] + [fmt(r[k], 3) if isinstance(r[k], float) else
                                         ("—" if r[k] is None else r[k]) for k in keys]
            for r in s["rows"]]
    rec = {"date": s["date"], "commit": s["commit"], "machine": s["machine"]}
    return table(["shape", "policy"] + keys, rows), provenance(
        [rec], name, "scripts/bench_arch_policies.sh")


def prefill_gate(name="prefill_gate.jsonl"):
    """The learned prefill estimate against pooled at equal budget (docs/prefill.md)."""
    if not os.path.exists(os.path.join(BENCH, name)):
        return "(no data yet: `scripts/quality_prefill_gate.sh`)\n", ""
    recs = load(name)
    by = collections.defaultdict(list)
    layers = []  # per-layer recovery: the trainer's held-out items, the test's prompt
    for r in recs:
        if r.get("kind") == "train":
            layers.append(["trainer's held-out items, budget " + fmt(r["budget"], 3),
                           " / ".join(fmt(x, 3) for x in r["recovery_learned"]),
                           " / ".join(fmt(x, 3) for x in r["recovery_pooled"])])
            continue
        if r.get("kind") == "recovery":
            layers.append([f"{r['prompt']}, budget {r['budget']}",
                           " / ".join(fmt(x, 3) for x in r["recovery"]["learned"]),
                           " / ".join(fmt(x, 3) for x in r["recovery"]["pooled"])])
            continue
        kind = r.get("task") or "KL, " + r.get("text", "?")
        by[(kind, r.get("length") or r.get("n_prefill"),
            r.get("prefill_policy"), r.get("prefill_budget"))].append(r)
    rows = []
    for k in sorted(by, key=lambda k: tuple(str(x) for x in k)):
        rs = by[k]
        acc = [r["accuracy"] for r in rs if "accuracy" in r]
        kl = [r["kl"] for r in rs if r.get("kl") is not None]
        est = [r["prefill_estimate_s"] / r["prefill_attention_s"] for r in rs
               if r.get("prefill_estimate_s") is not None and r.get("prefill_attention_s")]
        dens = [r["prefill_density"] for r in rs if r.get("prefill_density") is not None]
        rows.append([k[0], k[1], k[2], k[3], fmt(100 * med(acc), 0) + " %" if acc else "—",
                     f"{med(kl):.3g}" if kl else "—", fmt(med(dens), 3) if dens else "—",
                     fmt(100 * med(est), 1) + " %" if est else "—"])
    out = table(["task", "tokens", "estimate", "budget", "accuracy", "KL", "density",
                 "estimate / attention"], rows)
    if layers:
        out += "\nShare of the dense attention the picks hold, layers 0 / 1 / 2 / 3:\n\n" + \
            table(["where", "learned", "pooled"], layers)
    return out, provenance(
        recs, name, "scripts/quality_prefill_gate.sh build")


SECTIONS = [
    ("Speed against llama.cpp", peers,
     "Random-weight files with real shapes (`kvpred synth`), both engines on the same files in "
     "alternation, idle host, two full runs of 3 reps each (medians over both runs; the last "
     "column the ratio of each run). pp512: prefill of 512 tokens; tg128: decode of 128 tokens "
     "from an empty cache; tg128 @512: with 512 tokens cached; decode @16384 / @4096: with that "
     "many cached, the quest rows against llama.cpp's dense decode."),
    ("Other architectures against llama.cpp", arch_peers,
     "Phi-3.5-mini and Gemma-2-2B shapes, every layer (`kvpred synth`, random weights, "
     "vocabulary 512), Q8_0 and Q4_K, 2 threads, kvpred `bench` and llama-bench on the same "
     "files in alternation, 5 reps, medians (docs/architectures.md). pp512: prefill of 512 "
     "tokens; tg64: decode of 64 tokens from an empty cache. Both engines stream the weights "
     "from memory in decode, so its rows move with the host's memory bandwidth, which its "
     "neighbours shared: single reps swing by ±15 %, and an earlier run that day had "
     "Gemma-2-2B Q4_K at 20.34 against 20.89 tok/s (0.97×)."),
    ("Policies on Gemma shapes at 32768 tokens", arch_policies,
     "Gemma 3 1B cut to 6 layers (5 windowed, 1 global) and Gemma 2 2B cut to 2 (1 and 1), "
     "random weights, Q8_0, 2 threads, budget 1/16: decode speed per policy and where the "
     "attention time and the KV bytes go between the windowed layers (rings of their window) "
     "and the global ones (docs/architectures.md). The policies run with `--dense-layers 0`: "
     "the engine's default of two dense leading layers would hold the cut Gemma 2's only "
     "global layer."),
    ("Against llama.cpp on an Intel Xeon", lambda: peers(
        name="peers_xeon.jsonl",
        command="REPS=1 LONG=32768 scripts/bench_peers.sh"),
     "The same script on an Intel Xeon VM (2 vCPUs, AVX-512 with VNNI, BF16 and FP16, AMX, 480 "
     "MiB of L3), where llama.cpp's own llama-bench and llama-batched-bench run (with its AMX "
     "kernels). One rep per row, each row's `note` says whether the host was idle. The 32768 "
     "rows: a real prefill of 32768 tokens each (llama-batched-bench's took ~20 minutes on the "
     "loaded host), then 32 decoded tokens."),
    ("Prefill of long prompts on an Intel Xeon", prefill_long,
     "SmolLM2-135M shape (`kvpred synth`, Q8_0), 2 threads, the Intel Xeon VM above, idle "
     "host, kvpred `bench --prefill N` and llama-bench `-p N -n 0` in alternation (one prompt "
     "per run; the span of the runs). Attention grows with the square of the prompt, so it is "
     "most of the work at these lengths; llama.cpp with its default f16 KV cache."),
    ("Block-sparse prefill of long prompts", prefill_sparse,
     "SmolLM2-135M shape (`kvpred synth`, Q8_0, random weights), 2 threads, real text prompts "
     "(the essays, tokenized; no tile fill), kvpred dense and sparse (`--prefill-policy sparse "
     "--prefill-budget B`) and llama-bench `-p N -n 0` without and with flash attention, in "
     "alternation per length (docs/prefill.md). Attention share: attention thread-seconds over "
     "threads × the prefill's seconds; estimate / attention: the sparse estimate's thread time "
     "over the attention's."),
    ("Decode after a real prefill, 32K to 128K tokens", long_decode_real,
     "SmolLM2-135M shape (`kvpred synth`, Q8_0, random weights), 2 threads, f16 KV: one prompt "
     "of essays per length prefilled for real with the block-sparse prefill at 1/16 (no tile "
     "fill), then each policy decodes 16 tokens from that same cache (`bench` with several "
     "`--policy`, docs/cli.md), every selecting policy reading 1/32. quest: as shipped (its "
     "first two layers dense); coarse-to-fine: every layer sparse, groups of 16 blocks ranked "
     "first. Each record's `note` says what else ran on the host."),
    ("The learned prefill estimate against pooled", prefill_gate,
     "The shipped model, `--prefill-policy learned` (the gate `models/kvpred-default.kvpg`) "
     "and `pooled` at the same budget, so the same density (docs/prefill.md): retrieval "
     "accuracy and next-token KL after the sparse prefill against the dense one; estimate / "
     "attention: the estimate's thread time over the sparse attention's (busy host)."),
    ("Retrieval after a block-sparse prefill (the shipped model)", prefill_sparse_quality,
     "`kvpred eval --task` after a dense and after a sparse prefill (default sparse settings), "
     "each decoded with the full cache and with quest; accuracy over depths 0-100 %, greedy, "
     "exact match. Density: the sparse prefill's keys read over keys seen at that length."),
    ("Many sequences at once on an Intel Xeon", lambda: batched(
        name="batched_xeon.jsonl",
        cmd="scripts/bench_batched.sh with llama.cpp's own llama-batched-bench (see each "
            "record's command)"),
     "As the next section, on the Intel Xeon VM above, idle host, one alternating run."),
    ("Many long contexts on an Intel Xeon", lambda: batched_disk(name="batched_disk_xeon.jsonl"),
     "As \"Many long contexts on the disk tier\" below, on the Intel Xeon VM, plus the RAM "
     "ceiling row: the same sequences and policy with every cache in RAM, batched against one "
     "after another."),
    ("Many sequences at once (aggregate decode)", batched,
     "SmolLM2-135M shape (`kvpred synth`, vocabulary 512), each row's decode aggregate over all "
     "sequences (tokens/s), medians of its runs, taken at nice -20 beside nice-19 compile jobs "
     "on a shared host (not idle). llama-server rows: N slots, N concurrent requests (how: "
     "`scripts/llama_server_bench.py`; at npp 4096 a prefill round, then a decode round with the "
     "prompts cached; its npl 8 row was stopped after 10 minutes of prefill in the lock). Peer's "
     "best npl: kvpred's npl 8 against the highest aggregate the peer reached at any npl."),
    ("Many long contexts on the disk tier", batched_disk,
     "SmolLM2-135M shape (`kvpred synth`, Q8_0), 2 threads, f16 KV (23040 bytes a token). Each "
     "sequence's cache on the disk tier (O_DIRECT) with a hot tier of `--hot-budget` tokens per "
     "tiered layer, or dense and untiered at the largest count that fits half the free RAM. Fill: "
     "one prompt of 4096 tokens prefilled, tiled to npp - 32 with re-rotated keys, the last 32 "
     "prefilled, its KV copied into every sequence; then each sequence decodes tokens of its own, "
     "all in one step each (batched), then the same number one sequence after another with the "
     "same tier (serial). Only the decode is timed, under the benchmark lock at nice -20 beside "
     "other work's nice-19 jobs (host load 20-40 on 2 cores; the fill ran outside the lock), "
     "except where the host column says idle (nothing else running but the fill's own jobs). "
     "Cold reads / s: read requests of the cold tiers per second of the batched decode, to hold "
     "against the disk's random-read rate (`build/disk_qd`, docs/batched.md). "
     "Hot-tier hits: selected (layer, block) units found hot or in flight in the batched decode; "
     "the random-weight model's queries change from token to token, so its selections do too."),
    ("Prefill against llama-server (llama-bench dies of SIGILL here)", peers_server,
     "`scripts/bench_peers.sh` on a CPU the llama.cpp peer binaries were not built for: "
     "llama-server stands in for llama-bench (pp512: median of 3 prompts of 512 tokens; tg128 "
     "after an 8-token prompt, tg128 @512 after a 512-token one), kvpred `bench` in alternation, "
     "3 reps, medians, under the benchmark lock at nice -20 beside nice-19 jobs (loaded host)."),
    ("Retrieval at the trained context (8192 tokens)", retrieval,
     "The shipped model, seed 7, 5 depths × 10 prompts per task, exact match, budgets as a share of "
     "the prompt."),
    ("Retrieval, every policy (8192 tokens, 10 prompts per task)", tasks_all,
     "Steps of 10 points: read as an ordering. Defaults: sink 16, local 16, 2 leading dense "
     "layers of 4."),
    ("Attention recovery on held-out text (stories260K)", recovery,
     "Prefill 256, decode 256 teacher-forced tokens, the last 40 KB of `tinystories_val.txt`; "
     "mean dense attention mass on the tokens each step read."),
    ("Policy time per token", policy_share,
     "The shipped model, 1 thread, budget 1/16, idle host, current binary (alternating with an "
     "older one, whose rows the file keeps as `binary`)."),
    ("Decode far past 32K tokens on an Intel Xeon", lambda: long_decode(
        name="long_decode_xeon.jsonl",
        command="OUT=bench/long_decode_xeon.jsonl scripts/bench_long_matrix.sh build"),
     "The same script on the Intel Xeon VM, idle host, nice -20, at one commit: 2 threads, 16 "
     "decoded tokens per run, caches filled with `bench --fill tile` (a real prefill of 4096 "
     "tokens of an essay tiled with re-rotated keys, the last 32 prefilled; the shipped model "
     "prefilled for real up to 32768 tokens). `quest`: the default (flat pass, the first two "
     "layers dense); \"no dense layers\": `--dense-layers 0`; \"approx q8\": the coarse-to-fine "
     "pass `--policy-opts groups=16,coarse=approx,visit=4,q8=1`. policy_share: the selection "
     "hooks' thread time, summed over the KV heads the two threads select side by side, over "
     "the wall time of a step (so up to 2); policy_cpu_share: their CPU time over the step's. "
     "Each record's `command` is its bench invocation."),
    ("Decode far past 32K tokens", long_decode,
     "2 threads, 16 decoded tokens per run, caches filled with `bench --fill tile` (a real "
     "prefill of 4096 tokens of an essay tiled with re-rotated keys, the last 32 prefilled; the "
     "shipped model's rows tiled too: its real 32K prefill failed because `bench` then refused "
     "`--fill-text` without `--fill tile`, which the script passed), taken at nice -20 under a "
     "lock beside nice-19 builds of other work. KV read: what the selections let attention read; flat meta: what a "
     "flat bound pass over every block reads; read floor: bandwidth / (weights + KV read + flat "
     "meta)."),
    ("Tiered store: disk against RAM", store_paired,
     "Disk tier with token-ahead prefetch against an untiered twin decoding the same tokens in "
     "alternating 16-token chunks (`--paired`), 512 tokens, 1 thread, budget 1/16, prefetch "
     "margin 128 for qpredictor and 64 for quest."),
    ("Tiered store: Redis against RAM", store_redis, "Quest 1/16, token prefetch, idle host."),
    ("Tiered store on a busy host", store_busy,
     "The paired disk run beside N CPU-bound competitors (`scripts/busy_host.sh`), quest 1/16."),
    ("Mat-vec kernels against a plain read", matvec,
     "One mat-vec over a 128 MiB matrix alternating with a plain read of it, 21 times, medians; "
     "ratio 1 means the kernel runs at the read bandwidth."),
    ("Toy model speed (stories260K, F32 KV cache)", engine_toy,
     "Per-token overheads: the whole model sits in the CPU caches."),
    ("Acceptance of the shipped model (full cache)", acceptance,
     "100 prompts per cell (5 depths × 20), greedy, exact match; \"prose\" hides the pass key in "
     "the essays."),
    ("Serving: kvpred serve against llama-server", serving,
     "SmolLM2-135M's shape (`kvpred synth`, Q8_0), 2 threads, 4 slots of 6144 tokens, "
     "streamed `/v1/completions`, greedy, 64 tokens per answer; each client sends a 4096-token "
     "document with a question, then 3 follow-up questions after it, then one more after a "
     "server restart (kvpred with `--kv-cache-dir`, quest at 1/16; llama-server with its default "
     "attention and `--cache-reuse 256`). Both servers in alternation under the benchmark lock "
     "at nice -20, one round per client count (each its own lock hold; the 4-client hold "
     "beside nice-19 jobs, the 8-client one on an idle host). "
     "TTFT: request wall time minus the decode time the server reports; p50 over clients. "
     "Aggregate: tokens of the follow-up phase over its wall time. llama-server's restart "
     "phase was not run: it keeps nothing across a restart (in the 2026-12-03 18:22 run, "
     "bench/history/, its restart TTFT at 4 clients was 1.4× its cold one). Its 8-client row "
     "is from that run (alone it holds the lock over 10 minutes; llama-server is unchanged "
     "since; on the idle host its 8-client run had not finished after 19 minutes and was "
     "stopped), the 4-client rows from the 20:12 hold, kvpred's 8-client row from the idle "
     "22:05 one."),
    ("Several questions on one document", multi_question,
     "`kvpred eval --task T --questions 4` on the shipped model at 8192 tokens (docs/"
     "evaluation.md): each document holds 4 needles with different keys at spread depths and "
     "is asked 4 questions in turn, each about another needle; accuracy per question index, in "
     "the order asked. keep: the document prefilled once, the cache truncated back to it before "
     "each question (an evicting policy's evictions stay); recompute: document and question "
     "prefilled anew for each question. The column \"kvpred serve does\" says which of the "
     "two the server does for the policy. On the niah tasks full and quest ran in keep mode only: for "
     "them the two modes give the same answers (tests/test_multi_question.c; the passkey rows "
     "show it). 10 documents per task: one answer is 10 points. The pass keys are named by colour, a form the shipped model never "
     "trained on: its full-cache passkey row measures that, not the policies."),
    ("Trainer speed (bf16 path against the f32 reference)", train_speed,
     "Whole optimiser steps of the shipped shape on random tokens, f32 and bf16 alternating, "
     "medians of 3 rounds."),
]


def render():
    out = ["# Results\n",
           "Made by `scripts/bench_tables.py` from the JSON lines in this folder: edit the data or "
           "the script, not this file. Every record carries the `date` and `commit` it was "
           "measured at and the `machine` (CPU model, cores, relevant flags); where older files "
           "lacked them, they were filled in from the commit that added the data. Superseded "
           "results are in `history/` (kept for reference, not read here). How each benchmark "
           "works and what its fields mean: `docs/cli.md`, `docs/performance.md`, "
           "`docs/store.md`, `docs/policies.md`; result files not tabled here are described "
           "where they are used (`serve_smoke.*`, `serve_ttft*`: `docs/server.md`).\n"]
    for title, fn, intro in SECTIONS:
        tab, prov = fn()
        out += [f"## {title}\n", intro + "\n", tab, prov]
    return "\n".join(out)


def main(argv):
    if len(argv) > 1 and argv[1] == "--stamp":
        path = argv[2]
        commit = argv[argv.index("--commit") + 1] if "--commit" in argv else subprocess.check_output(
            ["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], text=True).strip()
        date = argv[argv.index("--date") + 1] if "--date" in argv else subprocess.check_output(
            ["date", "-u", "+%Y-%m-%dT%H:%M:%S+00:00"], text=True).strip()
        stamp(path, commit, date)
        return 0
    text = render()
    path = os.path.join(BENCH, "README.md")
    if len(argv) > 1 and argv[1] == "--check":
        cur = open(path).read() if os.path.exists(path) else ""
        if cur != text:
            print("bench/README.md is stale: run scripts/bench_tables.py", file=sys.stderr)
            return 1
        return 0
    if len(argv) > 1 and argv[1] == "--headline":
        for fn in (lambda: peers(headline=True), retrieval, store_paired):
            tab, prov = fn()
            print(tab + prov)
        return 0
    with open(path, "w") as f:
        f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
