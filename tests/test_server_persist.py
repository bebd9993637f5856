#!/usr/bin/env python3
"""ctest test_server_persist: what `kvpred serve` keeps in --kv-cache-dir survives damage and
crashes, with the default model on a free loopback port.

  flips   a bit flipped in the first, a middle and the last unit of a cached prefix file: each
          refused with one line when read back, the prompt recomputed, the answer kvpred run's
  kills   KILL_POINTS times (default 100): the server is killed with SIGKILL at a random moment
          while requests are answered and their prefixes written, half the time at the moment
          a prefix file is being written (a .tmp appears in the folder), then restarted on the
          same folder: no half-written file is left, and every answer before and after each
          kill equals `kvpred run`'s (a partial or mixed prefix would change it)

usage: test_server_persist.py KVPRED_BINARY SOURCE_DIR [PART...]   (exit 0 passed; 77 skipped)
Environment: KILL_POINTS (100), KILL_SEED (random; printed so a failure can be replayed).
"""
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

KVPRED, SRC = sys.argv[1], sys.argv[2]
PARTS = sys.argv[3:] or ["flips", "kills"]
MODEL = os.path.join(SRC, "models", "kvpred-default.gguf")
KILL_POINTS = int(os.environ.get("KILL_POINTS", "100"))
CTX = 4096
HEADER = 72  # a prefix file's header bytes (src/server/prefix.c), then 4 bytes per token
passed = 0


def check(cond, what):
    global passed
    if not cond:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)
    passed += 1
    print(f"ok: {what}", flush=True)


def start(d, *extra):
    args = [KVPRED, "serve", "-m", MODEL, "--port", "0", "-c", str(CTX), "--kv-cache-dir", d,
            *extra]
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("listening "):
        print("server did not start:", line, p.stderr.read())
        sys.exit(1)
    return p, int(line.split()[1])


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(120)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    return p.stderr.read()


def ask(port, prompt, n=8, timeout=120):
    """A completion; the parsed answer, or None when the connection broke (a kill)."""
    data = json.dumps({"prompt": prompt, "max_tokens": n}).encode()
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                   f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n")
                  .encode() + data)
        out = b""
        while (b := s.recv(65536)):
            out += b
        s.close()
        head, _, body = out.partition(b"\r\n\r\n")
        if b" 200 " not in head.split(b"\r\n")[0] + b" ":
            return {"status": head[:40]}
        return json.loads(body)
    except (OSError, ValueError):
        return None


def run_cli(prompt, n):
    out = subprocess.run([KVPRED, "run", "-m", MODEL, "-c", str(CTX), "-p", prompt, "-n", str(n),
                          "--temp", "0"], capture_output=True, timeout=300).stdout
    assert out.startswith(prompt.encode()), out[:80]
    return out[len(prompt.encode()):-1].decode("utf-8", "replace")


def document(k, lines):
    words = ["river", "tower", "garden", "harbor", "forest", "market", "bridge", "valley"]
    return " ".join(f"Line {i}: the {words[(i + k) % 8]} was quiet and the key of door {k} is "
                    f"not here." for i in range(lines))


def prefix_files(d):
    return sorted(f for f in os.listdir(d) if f.endswith(".kvpfx"))


def flips():
    doc = document(0, 120)
    q = " Q: where is the key?"
    want = run_cli(doc + q, 8)
    d = tempfile.mkdtemp(prefix="kvpred-persist-")
    try:
        p, port = start(d)
        first = ask(port, doc, 4)
        stop(p)
        files = prefix_files(d)
        check(first and len(files) == 1, f"the document's prefix written: {files}")
        path = os.path.join(d, files[0])
        n = int(files[0].split("-")[1].split(".")[0])
        with open(path, "rb") as f:
            pristine = f.read()
        data0 = HEADER + 4 * n
        # the first data byte of the first unit, the middle of the data, the last data byte of
        # the last unit (its checksum's 8 bytes follow it)
        where = {"first": data0, "middle": data0 + (len(pristine) - data0) // 2,
                 "last": len(pristine) - 9}
        p, port = start(d)
        good = ask(port, doc + q)
        stop(p)
        check(good["kvpred"]["prefix_reused"] > 0 and good["choices"][0]["text"] == want,
              f"the intact file is used ({good['kvpred']['prefix_reused']} tokens reused) and the "
              "answer equals kvpred run's")
        for name, off in where.items():
            bad = bytearray(pristine)
            bad[off] ^= 0x04
            with open(path, "wb") as f:
                f.write(bad)
            p, port = start(d)
            r = ask(port, doc + q)
            err = stop(p)
            check(r["kvpred"]["prefix_reused"] == 0 and r["choices"][0]["text"] == want and
                  err.count("refused") == 1 and "checksum" in err,
                  f"a bit flipped in the {name} unit (byte {off} of {len(pristine)}): refused "
                  f"with one line, recomputed, the same answer")
            with open(path, "wb") as f:  # the next flip starts from the intact file
                f.write(pristine)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def kills():
    seed = int(os.environ.get("KILL_SEED", str(random.randrange(1 << 30))))
    rng = random.Random(seed)
    print(f"kills: {KILL_POINTS} kill points, KILL_SEED={seed}", flush=True)
    docs = [document(k, 40 + 25 * k) for k in range(5)]
    q = " Q: which door?"
    wants = [run_cli(doc + q, 8) for doc in docs]
    d = tempfile.mkdtemp(prefix="kvpred-kill-")
    t0 = time.time()
    n_answers = n_cached = n_mid_write = n_tmp_seen = 0
    try:
        for k in range(KILL_POINTS):
            p, port = start(d, "-np", "2")
            left = [f for f in os.listdir(d) if f.endswith(".tmp")]
            if left:  # the server deletes what the killed one did not finish as it starts
                check(False, f"kill point {k}: a half-written file left after the restart: "
                      f"{left}")
            picks = [rng.randrange(len(docs)) for _ in range(2)]
            res = [None, None]

            def one(i):
                res[i] = ask(port, docs[picks[i]] + q)
            th = [threading.Thread(target=one, args=(i,)) for i in range(2)]
            for t in th:
                t.start()
            if k % 2 == 0:
                # at the moment a prefix file is being written (or, when none comes, at once)
                until = time.time() + 5
                while time.time() < until and not any(f.endswith(".tmp")
                                                      for f in os.listdir(d)):
                    if not any(t.is_alive() for t in th) and time.time() > until - 4.5:
                        break
                time.sleep(rng.uniform(0, 0.002))
            else:
                time.sleep(rng.uniform(0, 1.0))
            p.kill()
            p.wait()
            tmp = [f for f in os.listdir(d) if f.endswith(".tmp")]
            n_mid_write += bool(tmp)
            for t in th:
                t.join(60)
            for i, r in enumerate(res):
                if r and "choices" in r:
                    n_answers += 1
                    n_cached += r["kvpred"]["prefix_reused"] > 0
                    if r["choices"][0]["text"] != wants[picks[i]]:
                        check(False, f"kill point {k}: an answer differs from kvpred run's "
                              f"(document {picks[i]}, {r['kvpred']['prefix_reused']} tokens "
                              f"reused): {r['choices'][0]['text']!r} != {wants[picks[i]]!r}")
            p.stderr.close()
            p.stdout.close()
        # the folder after the last kill: restarted, every document answered as kvpred run does
        p, port = start(d, "-np", "2")
        n_tmp_seen = len([f for f in os.listdir(d) if f.endswith(".tmp")])
        final = [ask(port, doc + q) for doc in docs]
        err = stop(p)
        reused = [r["kvpred"]["prefix_reused"] for r in final]
        check(all(r["choices"][0]["text"] == w for r, w in zip(final, wants)) and
              n_tmp_seen == 0 and "refused" not in err,
              f"after the last kill: no half-written file, every document's answer equals "
              f"kvpred run's (reused {reused}), no file refused")
        check(n_answers > 0,
              f"{KILL_POINTS} kills ({n_mid_write} in the middle of a file's write) in "
              f"{time.time() - t0:.0f} s: {n_answers} answers between them, {n_cached} from "
              f"cached prefixes, each equal to kvpred run's")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def note_skip(why):
    """Count a skip where scripts/test.sh reads them ($KVP_SKIP_LOG)."""
    log = os.environ.get("KVP_SKIP_LOG")
    if log:
        with open(log, "a") as f:
            f.write("test_server_persist.py: " + why + "\n")


def main():
    if not os.path.exists(MODEL):
        if os.environ.get("CI") in ("true", "1"):
            check(False, f"no default model at {MODEL}")
        print("skipped: no default model at", MODEL)
        note_skip(f"no default model at {MODEL}")
        sys.exit(77)
    for part in PARTS:
        t0 = time.time()
        globals()[part]()
        print(f"-- {part}: {time.time() - t0:.1f} s", flush=True)
    print(f"{passed} passed, 0 failed")


main()
