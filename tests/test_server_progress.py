#!/usr/bin/env python3
"""ctest test_server_progress: `kvpred serve` reports a long prefill's progress while it runs,
in /metrics (per slot: tokens done and total, rate, time left) and as SSE comments to a
streaming client waiting for its first token.

The model is a random-weight one of SmolLM2-135M's shape cut to 8 layers (`kvpred synth`,
written to a temporary folder), so that a prompt of some 2300 tokens takes seconds on one
thread; the whole prompt is one piece (-b above its length), so every report inside the prefill
comes from the library's per-layer counter (kvp_ctx_progress_tokens), not from piece ends.

usage: test_server_progress.py KVPRED_BINARY SOURCE_DIR   (exit 0 passed)
"""
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_client as sc  # noqa: E402
from serve_client import check  # noqa: E402

KVPRED, SRC = sys.argv[1], sys.argv[2]
CTX = 8192


def slot0(m, name):
    return m[f'kvpred_slot_{name}{{slot="0"}}']


def stream_events(port, body, events):
    """Read a streamed answer; append (time, event) for each SSE event or comment as it comes."""
    s = socket.create_connection(("127.0.0.1", port), timeout=600)
    s.sendall(sc.request_bytes(port, "POST", "/v1/completions", {**body, "stream": True}))
    buf = b""
    head_done = False
    while (b := s.recv(65536)):
        buf += b
        if not head_done:
            if b"\r\n\r\n" not in buf:
                continue
            _, _, buf = buf.partition(b"\r\n\r\n")
            head_done = True
        # chunked: take whole chunks, then whole events out of their bytes
        while True:
            size, sep, rest = buf.partition(b"\r\n")
            if not sep:
                break
            n = int(size.split(b";")[0], 16)
            if n == 0 or len(rest) < n + 2:
                break
            events.append((time.time(), rest[:n].decode()))
            buf = rest[n + 2:]
    s.close()


def main():
    tmp = tempfile.mkdtemp(prefix="kvpred-progress-")
    try:
        model = os.path.join(tmp, "smol8.gguf")
        subprocess.run([KVPRED, "synth", "--shape", "SmolLM2-135M", "--layers", "8", "-o", model],
                       check=True, capture_output=True, timeout=600)
        # 1 thread, one slot, the prompt in one piece, no prefix cache: every request a cold
        # prefill of the whole prompt
        p, port = sc.start(KVPRED, model, "-np", "1", "-t", "1", "-b", "2560", "--cache-ram", "0",
                           ctx=CTX)
        try:
            run(port)
        finally:
            rc, err = sc.stop(p)
            check(rc == 0 and not sc.sanitizer_report(err),
                  f"the server stops cleanly (exit {rc})" + ("" if rc == 0 else err[-2000:]))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"{sc.passed()} passed, 0 failed")


def run(port):
    words = ["river", "tower", "garden", "harbor", "forest", "market", "bridge", "valley"]
    # a prompt of about 2300 tokens (the synth model's byte-level vocabulary: told by usage)
    doc = " ".join(f"{words[i % 8]} {i}" for i in range(300))
    m = sc.metrics(port)
    check(slot0(m, "prefilling") == 0 and slot0(m, "prefill_tokens_total") == 0,
          "an idle slot reports no prefill")

    # 1. /metrics while a non-streamed request prefills
    samples, answer = [], {}

    def ask():
        st, _, body = sc.http(port, "POST", "/v1/completions",
                              {"prompt": doc, "max_tokens": 1}, timeout=600)
        answer.update(json.loads(body) if st == 200 else {"status": st})

    t = threading.Thread(target=ask)
    t.start()
    while t.is_alive():
        m = sc.metrics(port)
        if slot0(m, "prefilling") == 1:
            samples.append((slot0(m, "prefill_tokens_done"), slot0(m, "prefill_tokens_total"),
                            slot0(m, "prefill_tokens_per_second"),
                            slot0(m, "prefill_seconds_left")))
        time.sleep(0.05)
    t.join()
    n_prompt = answer["usage"]["prompt_tokens"]
    check(n_prompt >= 1024, f"the prompt is {n_prompt} tokens")
    total = {s[1] for s in samples}
    check(total == {n_prompt}, f"every sample during the prefill has its total {total}")
    mid = [s for s in samples if 0 < s[0] < n_prompt]
    check(len(mid) >= 2, f"{len(mid)} of {len(samples)} samples show the one piece partly done "
          f"(tokens done {sorted({int(s[0]) for s in samples})})")
    dones = [s[0] for s in samples]
    check(dones == sorted(dones), "tokens done never go back")
    check(all(s[2] > 0 and s[3] >= 0 for s in mid),
          f"with a rate and a time left once tokens are done {mid[:3]}")
    m = sc.metrics(port)
    check(slot0(m, "prefilling") == 0 and slot0(m, "prefill_tokens_done") == 0,
          "after the answer the slot reports no prefill")

    # 2. a streamed request: comments with the progress before the first token
    events = []
    # other tokens (nothing is reused anyway: no prefix cache, one slot), and about 6000 of
    # them in three pieces: on an idle machine the first prompt is read in about 2 s, too soon
    # for the comments a second apart that this part counts
    doc2 = "Again: " + " ".join(f"{words[i % 8]} {i}" for i in range(800))
    stream_events(port, {"prompt": doc2, "max_tokens": 2}, events)
    first_data = next((i for i, (_, e) in enumerate(events) if e.startswith("data: ")), None)
    check(first_data is not None and events[-1][1].startswith("data: [DONE]"),
          f"the stream ends with [DONE] ({len(events)} events)")
    comments = [(tm, e) for tm, e in events[:first_data] if e.startswith(": prefill ")]
    check(len(comments) >= 2, f"{len(comments)} progress comments before the first token: "
          f"{[e.strip() for _, e in comments[:4]]}")
    parsed = [re.match(r": prefill (\d+)/(\d+) tokens \((\d+) reused\)", e) for _, e in comments]
    check(all(parsed), "each says tokens done/total and reused")
    done = [int(x.group(1)) for x in parsed]
    tot = {int(x.group(2)) for x in parsed}
    check(len(tot) == 1 and done == sorted(done) and max(done) <= min(tot),
          f"done {done} of {tot}: growing, within the prompt")
    gaps = [b[0] - a[0] for a, b in zip(comments, comments[1:])]
    check(all(g < 1.0 + 1.0 for g in gaps),
          f"one comment about every second (gaps {[round(g, 2) for g in gaps]} s; 1 s, plus up "
          f"to one waiter wake-up and a loaded host's scheduling: < 2 s)")
    text = sc.answer_text("".join(e for _, e in events), stream=True)
    check(text is not None, "an SSE parser that skips comments reads the answer whole")


main()
