#!/usr/bin/env python3
"""The "on paper" network table of docs/store.md: what a 10 / 25 / 100 Gb/s link between the engine and a
remote KV store (Redis) would cost a tiered decode step, per model shape and context, with the
RAM tier's link model (src/store/cold_ram.c: a serial link of bandwidth B; a transfer holds it for
bytes/B and completes one latency later; transfers are pipelined, so latency is paid per round
trip, not per transfer).

  scripts/kv_network_table.py [BENCH.jsonl] [--latency-us US] [--mem-gbps GBPS]

BENCH.jsonl: a `kvpred bench --kv-tier ... --prefetch token --json` line of the shipped model at
budget 1/16 (the last line with a "store" object is used); it gives the traffic of a tiered step
relative to its selection: units prefetched and missed per token against units selected.
Default: bench/redis_quest_kvpred-default.jsonl. Everything else is arithmetic on the shapes; the
assumptions are printed under the table.
"""
import argparse
import json
import sys

# name: (layers, dim, heads, kv_heads, ffn, vocab) as `kvpred synth --help` lists them
SHAPES = {
    "SmolLM2-135M": (30, 576, 9, 3, 1536, 49152),
    "Llama-3.2-1B": (16, 2048, 32, 8, 8192, 128256),
}
CONTEXTS = [32768, 65536, 131072]
LINKS_GBIT = [10, 25, 100]
BLOCK = 16          # tokens per KV block (the default)
DENSE_LAYERS = 2    # layers quest keeps dense (never transferred)
BUDGET = 1 / 16     # of the context, per tiered layer and KV head
F16 = 2
Q8_0 = 34 / 32      # bytes per weight


def churn(path):
    row = None
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                o = json.loads(line)
                if o.get("store"):
                    row = o
    if row is None:
        sys.exit(f"{path}: no line with a store object")
    s = row["store"]
    selected = s["hits"] + s["misses"]
    return {
        "prefetch": s["prefetched"] / selected,
        "miss": s["misses"] / selected,
        "ctx": row["ctx"],
        "tier": row["kv_tier"],
        "hit_rate": s["hit_rate"],
    }


def step_seconds(shape, ctx, gbit, lat_s, mem_bps, ch):
    layers, dim, heads, kvh, ffn, vocab = shape
    hd = dim // heads
    unit = kvh * 2 * BLOCK * hd * F16                      # K and V of every KV head, one block
    unit = -(-unit // 4096) * 4096
    kv_layer = ctx // BLOCK * unit                         # one layer's whole cache
    tiered = layers - DENSE_LAYERS
    sel_units = tiered * (ctx * BUDGET // BLOCK)           # units a step selects
    weights = (layers * (2 * dim * dim + 2 * dim * kvh * hd + 3 * dim * ffn) + vocab * dim) * Q8_0
    # the engine: memory-bound, reads the weights, the dense layers whole, the selection
    compute = (weights + DENSE_LAYERS * kv_layer + sel_units * unit) / mem_bps
    link = gbit * 1e9 / 8
    moved = (ch["prefetch"] + ch["miss"]) * sel_units * unit + tiered * unit / BLOCK
    miss_bytes = ch["miss"] * sel_units * unit
    miss_layers = min(tiered, ch["miss"] * sel_units)      # layers with a miss: one round trip each
    stall = miss_layers * lat_s + miss_bytes / link
    # prefetches and write-through overlap the step; a link slower than that stretches it
    step = max(compute, moved / link) + stall
    return compute, step, moved


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bench", nargs="?", default="bench/redis_quest_kvpred-default.jsonl")
    ap.add_argument("--latency-us", type=float, default=50.0)
    ap.add_argument("--mem-gbps", type=float, default=30.0)
    a = ap.parse_args()
    ch = churn(a.bench)
    lat, mem = a.latency_us * 1e-6, a.mem_gbps * 1e9
    print(f"tiered step time / RAM sparse step time (quest 1/16, token prefetch), link latency "
          f"{a.latency_us:g} µs, engine memory {a.mem_gbps:g} GB/s")
    print("| shape | ctx | RAM sparse ms/token | moved per token | " +
          " | ".join(f"{g} Gb/s" for g in LINKS_GBIT) + " |")
    print("|---|---:|---:|---:|" + "---:|" * len(LINKS_GBIT))
    for name, shape in SHAPES.items():
        for ctx in CONTEXTS:
            cells = []
            for g in LINKS_GBIT:
                compute, step, moved = step_seconds(shape, ctx, g, lat, mem, ch)
                cells.append(f"{step / compute:.2f}×")
            print(f"| {name} | {ctx // 1024}K | {compute * 1e3:.2f} | {moved / 2**20:.2f} MiB | "
                  + " | ".join(cells) + " |")
    print()
    print(f"Traffic from {a.bench} ({ch['tier']} tier, ctx {ch['ctx']}): per token, prefetched "
          f"units = {ch['prefetch'] * 100:.2f} % and missed units = {ch['miss'] * 100:.2f} % of "
          f"the units selected (hit rate {ch['hit_rate'] * 100:.1f} %), taken to hold for every "
          f"shape and context. Engine step = (Q8_0 weights + {DENSE_LAYERS} dense layers' whole "
          f"KV + the f16 selection) / memory bandwidth. Misses stall one round trip per layer "
          f"that has one plus their bytes over the link; prefetches and write-through overlap the "
          f"step unless the link cannot carry them within it. Store-side time, TCP/RESP overhead "
          f"and the engine's own I/O CPU are not modelled.")


if __name__ == "__main__":
    main()
