#!/usr/bin/env python3
"""ctest test_server: `kvpred serve` on a free loopback port with the default model, driven by
curl (the answers), raw sockets (malformed and misbehaving clients) and threads (more requests
than slots). Every answer is compared with `kvpred run` on the same prompt, sampler and seed:
the server must generate exactly what the CLI does, token for token, so the comparison is exact
(no tolerance: both run the same kvp_eval / sampler calls in the same order).

usage: test_server.py KVPRED_BINARY SOURCE_DIR   (exit 0: passed; 77: skipped)
Prints one line per check and "N passed, 0 failed" at the end.
"""
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

KVPRED, SRC = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SRC, "models", "kvpred-default.gguf")
CTX = 1024
KEY = "test-key-3f9a"
passed = 0


def missing(what):
    """A missing input: under CI=true the run fails naming it; elsewhere the part is skipped,
    said on stdout and counted in $KVP_SKIP_LOG (scripts/test.sh prints the count)."""
    if os.environ.get("CI") in ("true", "1"):
        print("FAIL: " + what + " (CI=true: a missing input fails the run)")
        sys.exit(1)
    print("skipped: " + what)
    note_skip(what)


def note_skip(why):
    log = os.environ.get("KVP_SKIP_LOG")
    if log:
        with open(log, "a") as f:
            f.write("test_server.py: " + why + "\n")


def check(cond, what):
    global passed
    if not cond:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)
    passed += 1
    print(f"ok: {what}", flush=True)


def start(*extra, key=KEY, ctx=CTX):
    args = [KVPRED, "serve", "-m", MODEL, "--port", "0", "-c", str(ctx), "--timeout", "3"]
    if key:
        args += ["--api-key", key]
    p = subprocess.Popen(args + list(extra), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    line = p.stdout.readline()
    if not line.startswith("listening "):
        print("server did not start:", line, p.stderr.read())
        sys.exit(1)
    return p, int(line.split()[1])


def stop(p, sig=signal.SIGTERM, timeout=120):
    p.send_signal(sig)
    try:
        return p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        return None


def send_stream(port, body):
    """Send a streamed /v1/completions request on a raw socket and leave it open (it keeps its
    slot busy until closed or read to the end); returns the socket."""
    data = json.dumps({**body, "stream": True}).encode()
    sk = socket.create_connection(("127.0.0.1", port), timeout=600)
    sk.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
                f"Content-Length: {len(data)}\r\n\r\n").encode() + data)
    return sk


def until_first_event(sk):
    """Read a stream until its first SSE event has come (the request holds a slot); returns
    what was read."""
    got = b""
    while b"data: " not in got:
        b = sk.recv(4096)
        if not b:
            break
        got += b
    return got


def http(port, method, path, body=None, key=KEY, headers=None, timeout=60):
    """One request on a fresh socket, HTTP/1.0 style (Connection: close); returns (status,
    headers text, body bytes)."""
    data = body if isinstance(body, (bytes, type(None))) else json.dumps(body).encode()
    h = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    if key:
        h.append(f"Authorization: Bearer {key}")
    if data is not None:
        h += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    h += headers or []
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    s.sendall(("\r\n".join(h) + "\r\n\r\n").encode() + (data or b""))
    out = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        out += b
    s.close()
    head, _, rest = out.partition(b"\r\n\r\n")
    status = int(head.split()[1])
    if b"chunked" in head.lower():
        rest = dechunk(rest)
    return status, head.decode(), rest


def dechunk(b):
    out = b""
    while b:
        size, _, b = b.partition(b"\r\n")
        n = int(size.split(b";")[0], 16)
        if n == 0:
            break
        out += b[:n]
        b = b[n + 2:]
    return out


def curl(port, path, body, key=KEY, stream=False):
    args = ["curl", "-sS", "-N" if stream else "-s", "-H", "Content-Type: application/json",
            "-H", f"Authorization: Bearer {key}", "-d", json.dumps(body),
            f"http://127.0.0.1:{port}{path}"]
    return subprocess.run(args, capture_output=True, text=True, timeout=300).stdout


def sse_text(raw, chat):
    """The streamed text of an SSE answer, and whether it ended with data: [DONE]."""
    text, done = "", False
    for ev in raw.split("\n\n"):
        if not ev.startswith("data: "):
            continue
        d = ev[6:]
        if d == "[DONE]":
            done = True
            continue
        j = json.loads(d)
        for c in j.get("choices", []):
            text += (c.get("delta", {}).get("content") or "") if chat else c.get("text", "")
    return text, done


def run_cli(prompt, n, chat=False, temp=0.0, seed=42, top_k=40, top_p=0.95, extra=(), ctx=CTX):
    args = [KVPRED, "run", "-m", MODEL, "-c", str(ctx), "-p", prompt, "-n", str(n),
            "--temp", str(temp), "--seed", str(seed), "--top-k", str(top_k), "--top-p",
            str(top_p), *extra]
    if chat:
        args.append("--chat")
    out = subprocess.run(args, capture_output=True, timeout=300).stdout
    # run echoes the prompt (or the chat template text), then the answer and a newline
    if chat:
        return None, out
    assert out.startswith(prompt.encode()), out[:80]
    return out[len(prompt.encode()):-1].decode("utf-8", "replace"), out


def metric(port, name):
    _, _, body = http(port, "GET", "/metrics")
    for line in body.decode().splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def main():
    if not os.path.exists(MODEL):
        missing("no default model at " + MODEL)
        sys.exit(77)
    p, port = start()
    try:
        # ---- health, auth, models
        st, _, body = http(port, "GET", "/health", key=None)
        check(st == 200 and json.loads(body)["status"] == "ok", "/health needs no key")
        st, head, body = http(port, "GET", "/v1/models", key=None)
        check(st == 401 and json.loads(body)["error"]["code"] == "invalid_api_key",
              "/v1/models without a key: 401 with an OpenAI error")
        st, _, _ = http(port, "GET", "/metrics", key=KEY + "x")
        check(st == 401, "/metrics with a wrong key: 401")
        st, _, _ = http(port, "GET", "/metrics", key=KEY[:-1])
        check(st == 401, "a key's prefix: 401")
        st, _, body = http(port, "GET", "/v1/models")
        check(st == 200 and json.loads(body)["data"][0]["id"] == "kvpred-default",
              "/v1/models names the model")

        # ---- answers equal kvpred run's
        prompt = "Once upon a time, a little girl named Lily"
        want, _ = run_cli(prompt, 40)
        got = json.loads(curl(port, "/v1/completions", {"prompt": prompt, "max_tokens": 40}))
        check(got["choices"][0]["text"] == want, "completion (greedy) equals kvpred run")
        check(got["usage"]["completion_tokens"] <= 40 and got["usage"]["prompt_tokens"] > 0,
              "usage counts")
        raw = curl(port, "/v1/completions", {"prompt": prompt, "max_tokens": 40, "stream": True},
                   stream=True)
        text, done = sse_text(raw, False)
        check(text == want and done, "streamed completion equals kvpred run, ends with [DONE]")
        want_s, _ = run_cli(prompt, 30, temp=0.9, seed=1234, top_k=20, top_p=0.9)
        got = json.loads(curl(port, "/v1/completions",
                              {"prompt": prompt, "max_tokens": 30, "temperature": 0.9,
                               "seed": 1234, "top_k": 20, "top_p": 0.9}))
        check(got["choices"][0]["text"] == want_s, "sampled completion (seed) equals kvpred run")
        _, chat_out = run_cli("Where did Lily go?", 30, chat=True)
        raw = curl(port, "/v1/chat/completions",
                   {"messages": [{"role": "user", "content": "Where did Lily go?"}],
                    "max_tokens": 30, "stream": True}, stream=True)
        text, done = sse_text(raw, True)
        check(done and len(text) > 0 and chat_out.endswith(text.encode() + b"\n"),
              "streamed chat equals kvpred run --chat")
        # a stop string ends the text before it
        cut = want[5:12]
        got = json.loads(curl(port, "/v1/completions",
                              {"prompt": prompt, "max_tokens": 40, "stop": [cut]}))
        check(got["choices"][0]["text"] == want[:want.index(cut)] and
              got["choices"][0]["finish_reason"] == "stop", "stop string")

        # ---- prefix reuse: a longer prompt that starts like a cached one
        doc = " ".join(f"Line {i}: the pass key is not here." for i in range(60))
        first = json.loads(curl(port, "/v1/completions", {"prompt": doc, "max_tokens": 4}))
        follow = doc + " Question: what is the pass key?"
        want_f, _ = run_cli(follow, 20)
        got = json.loads(curl(port, "/v1/completions", {"prompt": follow, "max_tokens": 20}))
        check(got["kvpred"]["prefix_reused"] >= first["usage"]["prompt_tokens"] - 1,
              f"follow-up reuses the cached prefix ({got['kvpred']['prefix_reused']} tokens)")
        check(got["choices"][0]["text"] == want_f, "answer after prefix reuse equals kvpred run")
        check(metric(port, "kvpred_prefix_cache_hits_total") >= 1, "/metrics counts the hit")
        # the same under quest at 1/4, chosen by the request (the extension field)
        ext = {"kvpred": {"policy": "quest", "budget": "1/4"}}
        curl(port, "/v1/completions", {"prompt": doc, "max_tokens": 4, **ext})
        got = json.loads(curl(port, "/v1/completions", {"prompt": follow, "max_tokens": 20, **ext}))
        want_q, _ = run_cli(follow, 20, extra=["--policy", "quest", "--budget", "1/4"])
        check(got["kvpred"]["prefix_reused"] > 0 and got["choices"][0]["text"] == want_q and
              got["kvpred"]["read_share"] == 0.25,
              "quest 1/4 by the extension field: prefix reused, answer equals kvpred run's")

        # policies that need a file find the one beside the model, in the server as in run
        for pol in ("predictor", "qpredictor", "catekv"):
            got = json.loads(curl(port, "/v1/completions",
                                  {"prompt": prompt, "max_tokens": 12, "kvpred": {"policy": pol}}))
            want_p, _ = run_cli(prompt, 12, extra=["--policy", pol])
            check(got["choices"][0]["text"] == want_p,
                  f"{pol} without a file: the model's own, answer equals kvpred run's")

        # ---- refusals: OpenAI-style errors with the right status
        def refused(body, status, what, path="/v1/completions", param=None):
            st, _, b = http(port, "POST", path, body)
            e = json.loads(b).get("error", {})
            check(st == status and e.get("message") and (param is None or e.get("param") == param),
                  f"{what}: {status}")
        refused(b"{\"prompt\": ", 400, "truncated JSON")
        refused(b"{\"prompt\": \"a\"} x", 400, "text after the JSON")
        refused(b"[1,2]", 400, "not an object")
        refused({"prompt": 5}, 400, "prompt of the wrong type", param="prompt")
        refused({"prompt": "a", "max_tokens": "9"}, 400, "max_tokens a string", param="max_tokens")
        refused({"prompt": "a", "max_tokens": 1.5}, 400, "max_tokens not whole", param="max_tokens")
        refused({"prompt": "a", "max_tokens": 10 ** 9}, 400, "max_tokens over the limit",
                param="max_tokens")
        refused({"prompt": "a", "temperature": 3}, 400, "temperature out of range",
                param="temperature")
        refused({"prompt": "a", "stream": "yes"}, 400, "stream not a bool", param="stream")
        refused({"prompt": "a", "kvpred": {"policy": "nope"}}, 400, "unknown policy",
                param="kvpred.policy")
        refused({"prompt": "a", "kvpred": {"budget": "3/2"}}, 400, "bad budget",
                param="kvpred.budget")
        refused({"messages": [{"role": "robot", "content": "x"}]}, 400, "unknown role",
                path="/v1/chat/completions", param="messages")
        refused({"messages": []}, 400, "no messages", path="/v1/chat/completions")
        refused({"model": "gpt-4", "prompt": "a"}, 404, "unknown model", param="model")
        refused({"prompt": "word " * 3000}, 400, "prompt longer than the context", param="prompt")
        # a huge Content-Length is refused from the headers, before the body is read
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                   f"Content-Length: {9 << 20}\r\nConnection: close\r\n\r\n").encode())
        resp = s.recv(4096)
        s.close()
        check(resp.split(b" ")[1] == b"413" and b"request_too_large" in resp,
              "huge body (Content-Length): 413")
        # a chunked body that grows past the limit: refused once it is all read
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                   "Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n").encode())
        chunk = b"y" * (1 << 20)
        try:
            for _ in range(9):
                s.sendall(b"%x\r\n" % len(chunk) + chunk + b"\r\n")
            s.sendall(b"0\r\n\r\n")
            resp = s.recv(200)
        except OSError as e:
            resp = f"HTTP/1.1 000 {e}".encode()
        s.close()
        check(resp.split(b" ")[1] == b"413", "huge chunked body: 413")
        st, _, _ = http(port, "GET", "/v1/completions")
        check(st == 405, "GET on a POST endpoint: 405")
        st, _, _ = http(port, "GET", "/nothing")
        check(st == 404, "unknown path: 404")

        # ---- slow client: the body arrives in pieces over ~1.5 s, still answered
        body = json.dumps({"prompt": prompt, "max_tokens": 40}).encode()
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                   f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n").encode())
        for i in range(0, len(body), len(body) // 5 + 1):
            time.sleep(0.3)
            s.sendall(body[i:i + len(body) // 5 + 1])
        out = b""
        while (b := s.recv(65536)):
            out += b
        s.close()
        j = json.loads(dechunk(out.partition(b"\r\n\r\n")[2]) if b"chunked" in out[:400].lower()
                       else out.partition(b"\r\n\r\n")[2])
        check(j["choices"][0]["text"] == want, "slow client answered (and the same)")
        # a client that sends half its headers and goes silent is closed after --timeout (3 s)
        # (the socket's own limit only bounds a server that never closes it: a loaded host may
        # run the timeout late, never early)
        s = socket.create_connection(("127.0.0.1", port), timeout=120)
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n")
        t0 = time.time()
        try:
            closed = s.recv(100) == b""
        except socket.timeout:
            closed = False
        except OSError:
            closed = True
        s.close()
        check(closed and time.time() - t0 >= 2.5,
              f"silent client closed after {time.time() - t0:.1f} s (--timeout 3)")

        # ---- disconnect mid-stream: the slot is freed at once
        cancelled0 = metric(port, "kvpred_requests_cancelled_total")
        gen0 = metric(port, "kvpred_generated_tokens_total")
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        body = json.dumps({"prompt": prompt, "max_tokens": 900, "stream": True,
                           "kvpred": {"policy": "full"}}).encode()
        s.sendall((f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                   f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
        got = b""
        while b"data: " not in got:
            got += s.recv(4096)
        s.close()
        # wait for the slot (the limit bounds a hung server only; the request asked for 900
        # tokens, so a count below that shows it was cut short, whatever the host's load)
        t0 = time.time()
        while time.time() - t0 < 120 and metric(port, "kvpred_slots_busy") != 0:
            time.sleep(0.05)
        gen = metric(port, "kvpred_generated_tokens_total")
        busy, cancelled = metric(port, "kvpred_slots_busy"), metric(port, "kvpred_requests_cancelled_total")
        check(b"data: " in got and busy == 0 and cancelled == cancelled0 + 1 and
              gen - gen0 < 900,
              f"disconnect mid-stream frees the slot ({time.time() - t0:.2f} s, "
              f"{gen - gen0:.0f} tokens; busy {busy}, cancelled {cancelled0} -> {cancelled})")
        time.sleep(0.3)
        check(metric(port, "kvpred_generated_tokens_total") == gen, "and generation stopped")

        # ---- 3x more concurrent requests than slots (2): all answered, each as if alone
        prompts = [f"Once upon a time there was a {w}" for w in
                   ["cat", "dog", "bird", "frog", "king", "tree"]]
        wants = [run_cli(q, 24)[0] for q in prompts]
        results = [None] * len(prompts)

        def worker(i):
            stream = i % 2 == 0
            r = curl(port, "/v1/completions", {"prompt": prompts[i], "max_tokens": 24,
                                               "stream": stream}, stream=stream)
            results[i] = sse_text(r, False)[0] if stream else json.loads(r)["choices"][0]["text"]
        th = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
        for t in th:
            t.start()
        for t in th:
            t.join(120)
        check(results == wants, "6 concurrent requests on 2 slots: every answer as if alone")

        # ---- the official openai client (npm), when scripts/install-node-deps.sh could get it
        mod = os.path.join(SRC, "tests", "node_modules", "openai")
        if not os.path.isdir(mod) or not shutil.which("node"):
            missing("the openai npm client is not installed (scripts/install-node-deps.sh;"
                    " npm unreachable?)")
        else:
            chat_q = "Where did Lily go?"
            r = subprocess.run(["node", os.path.join(SRC, "tests", "server_openai.mjs"),
                                str(port), KEY, prompt, want, chat_q],
                               capture_output=True, text=True, timeout=120)
            check(r.returncode == 0, "openai npm client: completions and chat, streamed and not "
                  "(equal to kvpred run), extension field, 404 as APIError " + r.stderr[-300:])
            got = json.loads(r.stdout.strip().splitlines()[-1])
            check(chat_out.endswith(got["chat"].encode() + b"\n"),
                  "openai client's chat answer equals kvpred run --chat")

        # ---- the page in headless Chromium (playwright-core driving Debian's chromium)
        pw = os.path.join(SRC, "tests", "node_modules", "playwright-core")
        chromium = os.environ.get("CHROMIUM", "/usr/bin/chromium")
        if not os.path.isdir(pw) or not os.path.exists(chromium) or not shutil.which("node"):
            missing("the page test needs Debian's chromium and playwright-core "
                    "(scripts/install-deps.sh, scripts/install-node-deps.sh)")
        else:
            r = subprocess.run(["node", os.path.join(SRC, "tests", "server_page.mjs"), str(port),
                                "Once upon a time, Lily went to the park. Where did Lily go?",
                                KEY] + ([os.environ["KVP_PAGE_SHOT"]]
                                        if os.environ.get("KVP_PAGE_SHOT") else []),
                               capture_output=True, text=True, timeout=120)
            check(r.returncode == 0, "the page streams an answer and fills the KV panel, and a "
                  "second turn counts a prefix-cache hit " + (r.stdout + r.stderr)[-400:])
    finally:
        rc = stop(p)
    check(rc == 0, "SIGTERM: the server stops cleanly")

    # ---- one slot, a queue of one, each step taken in order so none depends on timing.
    # 1. A stream that waits for its slot longer than --timeout (1 s here) is kept alive with
    #    SSE comments, and completes (a connection silent past the timeout was closed in the
    #    middle of its chunked body: the streams of a busy server broke at random).
    # 2. A full queue answers 429; SIGINT lets the request in flight finish and answers the
    #    queued one 503. --grace leaves it all the time it needs however loaded the host is
    #    (the default 10 s does not: 2000 tokens of an ASan build on a busy machine take longer).
    p, port = start("-np", "1", "--queue", "1", "--grace", "600", "--timeout", "1", key=None,
                    ctx=2048)
    try:
        def wait_metrics(cond, what, limit=120):
            # a readiness wait, not a speed check: the limit only bounds a hung server
            t0 = time.time()
            while time.time() - t0 < limit:
                if cond(lambda name: metric(port, name)):
                    return
                time.sleep(0.01)
            check(False, f"waited {limit} s for {what}")

        def open_stream(body):
            """A streamed request on a raw socket that asks for its usage counts."""
            return send_stream(port, {**body, "stream_options": {"include_usage": True}})

        def read_stream(sk, out=b""):
            """The rest of a stream: (text, ended with [DONE], completion tokens, raw body)."""
            while (b := sk.recv(65536)):
                out += b
            sk.close()
            body = dechunk(out.partition(b"\r\n\r\n")[2]).decode()
            text, done = sse_text(body, False)
            usage = [json.loads(ev[6:]).get("usage") for ev in body.split("\n\n")
                     if ev.startswith("data: {")]
            return text, done, ([u for u in usage if u] or [{}])[-1].get("completion_tokens"), body

        def first_event(sk):
            out = b""
            while b"data: " not in out:
                b = sk.recv(4096)
                if not b:
                    check(False, f"a stream's first event: {out[-300:]!r}")
                out += b
            return out

        long_req = {"prompt": prompt, "max_tokens": 2000}
        a = open_stream(long_req)
        a_out = first_event(a)
        b = open_stream({"prompt": prompt, "max_tokens": 8})
        text_b, done_b, _, raw_b = read_stream(b)
        text_a, done_a, n_a, _ = read_stream(a, a_out)
        ttft_b = [json.loads(ev[6:])["kvpred"].get("ttft_ms") for ev in raw_b.split("\n\n")
                  if ev.startswith("data: {") and '"kvpred"' in ev][-1]
        check(done_a and n_a == 2000 and done_b and text_b,
              f"a stream queued {ttft_b:.0f} ms behind another (--timeout 1 s) completes")
        if ttft_b > 1000:  # longer than --timeout: without keep-alives it would be cut
            check(": keep-alive" in raw_b, "and was kept alive by SSE comments while it waited")
        else:
            print(f"note: the queued stream waited only {ttft_b:.0f} ms; keep-alive not exercised")

        a = open_stream(long_req)
        a_out = first_event(a)
        res_b = []
        tb = threading.Thread(target=lambda: res_b.append(
            http(port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 8}, key=None,
                 timeout=600)))
        tb.start()
        wait_metrics(lambda m: m("kvpred_queue_depth") == 1, "B to wait in the queue")
        busy = [http(port, "POST", "/v1/completions", {"prompt": prompt, "max_tokens": 8},
                     key=None) for _ in range(8)]
        check(all(r[0] == 429 and "Retry-After" in r[1] and
                  json.loads(r[2])["error"]["code"] == "rate_limit_exceeded" for r in busy),
              "full queue: 429 (rate_limit_exceeded) with Retry-After, 8 of 8: "
              + str([r[0] for r in busy]))
        in_flight = metric(port, "kvpred_slots_busy"), metric(port, "kvpred_queue_depth")
        p.send_signal(signal.SIGINT)
        text_a, done_a, n_a, _ = read_stream(a, a_out)
        tb.join(600)
        check(in_flight == (1, 1) and done_a and text_a and n_a == 2000,
              f"in flight at SIGINT (busy, queued {in_flight}): finished with its whole answer "
              f"({n_a} tokens)")
        check(res_b and res_b[0][0] == 503 and "Retry-After" in res_b[0][1] and
              json.loads(res_b[0][2])["error"]["code"] == "server_stopping",
              "queued at SIGINT: 503 server_stopping with Retry-After")
    finally:
        rc = stop(p, signal.SIGINT, timeout=600)
    check(rc == 0, f"SIGINT: the server stops cleanly (exit {rc}; {p.stderr.read()[-300:]!r})")
    prefix_cache()
    follow_up_slot()
    prefix_cache_tiered()
    kv_lost()
    tiered_share()
    print(f"{passed} passed, 0 failed")


def follow_up_slot():
    """A follow-up question goes to the slot that still holds its document (two documents on
    two slots): nothing is prefilled but the question, nothing read from the prefix cache."""
    ctx = 2048
    docs = [" ".join(f"Line {i}: the {w} was calm and the pass key is not here." for i in range(60))
            for w in ("lake", "field")]
    pol = ["--policy", "quest", "--budget", "1/8"]
    p, port = start("-np", "2", *pol, key=None, ctx=ctx)
    try:
        for doc in docs:
            curl(port, "/v1/completions", {"prompt": doc, "max_tokens": 2}, key="")
        loads0 = metric(port, "kvpred_prefix_cache_loads_total")
        pre0 = metric(port, "kvpred_prefill_tokens_total")
        q = docs[0] + " Q: what was calm?"
        got = json.loads(curl(port, "/v1/completions", {"prompt": q, "max_tokens": 8}, key=""))
        loads1 = metric(port, "kvpred_prefix_cache_loads_total")
        pre1 = metric(port, "kvpred_prefill_tokens_total")
    finally:
        stop(p)
    want, _ = run_cli(q, 8, ctx=ctx, extra=pol)
    u = got["usage"]
    check(loads1 == loads0 and pre1 - pre0 == u["prompt_tokens"] - got["kvpred"]["prefix_reused"]
          and pre1 - pre0 < 32,
          f"a follow-up goes to the slot holding its document ({pre1 - pre0:.0f} tokens "
          f"prefilled, prefix-cache loads {loads0:.0f} -> {loads1:.0f})")
    check(got["choices"][0]["text"] == want, "and the answer equals kvpred run's")


def prefix_cache_tiered():
    """The prefix cache with tiered slots (--kv-tier disk: the blocks live in the store): a
    document is kept in RAM and in --kv-cache-dir, read back into the store's cold tier after a
    restart, checked like an untiered slot's (a flipped bit in a unit: refused with one line,
    recomputed), and the answers equal kvpred run's."""
    ctx = 2048
    doc = " ".join(f"Line {i}: the hill was green and the pass key is not here." for i in range(60))
    d, kd = tempfile.mkdtemp(prefix="kvpred-prefix-"), tempfile.mkdtemp(prefix="kvpred-tier-")
    pol = ["--policy", "quest", "--budget", "1/8"]

    def serve():
        return start("-np", "2", "--kv-tier", "disk", "--kv-dir", kd, "--hot-budget", "64",
                     "--kv-cache-dir", d, *pol, key=None, ctx=ctx)

    def ask(port, q, n=8):
        return json.loads(curl(port, "/v1/completions", {"prompt": doc + q, "max_tokens": n},
                               key=""))
    try:
        p, port = serve()
        try:
            cold = ask(port, "", 2)
            n_doc = cold["usage"]["prompt_tokens"]
            # the other slot (the first still holds the document) reads it from the prefix cache
            busy = send_stream(port, {"prompt": doc + " Q: what else?", "max_tokens": 400})
            until_first_event(busy)
            warm = ask(port, " Q: where?")
            loads = metric(port, "kvpred_prefix_cache_loads_total")
            busy.close()
        finally:
            rc = stop(p)
        files = [f for f in os.listdir(d) if f.endswith(".kvpfx")]
        want_w, _ = run_cli(doc + " Q: where?", 8, ctx=ctx, extra=pol)
        check(rc == 0 and len(files) == 1 and loads >= 1 and
              warm["kvpred"]["prefix_reused"] >= n_doc - 16 and warm["kvpred"]["kv_bytes_cold"] > 0
              and warm["choices"][0]["text"] == want_w,
              f"tiered slots: the document kept in the prefix cache and its folder ({files}), "
              f"read into the other slot's store ({warm['kvpred']['prefix_reused']} of {n_doc} "
              f"reused, {loads:.0f} loads), answer equal to kvpred run's")

        p, port = serve()
        again = ask(port, " Q: who?")
        prefilled = metric(port, "kvpred_prefill_tokens_total")
        stop(p)
        want, _ = run_cli(doc + " Q: who?", 8, ctx=ctx, extra=pol)
        check(again["kvpred"]["prefix_reused"] >= n_doc - 16 and prefilled < 32 and
              again["kvpred"]["kv_bytes_cold"] > 0 and again["choices"][0]["text"] == want,
              f"tiered slots after a restart: the prefix read back from the folder "
              f"({prefilled:.0f} tokens prefilled), answer equal to kvpred run's")

        path = os.path.join(d, files[0])
        with open(path, "r+b") as f:
            size = f.seek(0, 2)
            f.seek(size * 3 // 4)
            b = f.read(1)
            f.seek(size * 3 // 4)
            f.write(bytes([b[0] ^ 0x01]))
        p, port = serve()
        bad = ask(port, " Q: who?")
        stop(p)
        err = p.stderr.read()
        check(bad["kvpred"]["prefix_reused"] == 0 and bad["choices"][0]["text"] == want and
              err.count("refused") == 1 and "checksum" in err,
              f"tiered slots, a flipped bit in a cached unit: refused with one line, recomputed, "
              f"same answer ({err.strip()!r})")
    finally:
        shutil.rmtree(d, ignore_errors=True)
        shutil.rmtree(kd, ignore_errors=True)


def tiered_share():
    """Tiered slots share prefixes: a document prefilled in one slot (busy with another question
    about it) is copied into the other slot for a third question instead of prefilled again,
    and the answer is still kvpred run's."""
    # The long answer must outlast the third request (a copy and 8 tokens) on a loaded host: at
    # ctx 8192 it may run ~6400 tokens (greedy, this prompt: no end-of-text before max_tokens),
    # ~4x the tokens of ctx 4096, where a busy CI host once let it finish first.
    ctx = 8192
    doc = " ".join(f"Line {i}: the road was long and the pass key is not here." for i in range(80))
    d = tempfile.mkdtemp(prefix="kvpred-tier-")
    pol = ["--policy", "quest", "--budget", "1/8"]
    try:
        p, port = start("-np", "2", "--kv-tier", "disk", "--kv-dir", d, "--hot-budget", "64",
                        *pol, key=None, ctx=ctx)
        try:
            first = json.loads(curl(port, "/v1/completions",
                                    {"prompt": doc + " Q: where?", "max_tokens": 4}, key=""))
            n_doc = first["usage"]["prompt_tokens"]
            # a long answer about the same document keeps the slot that holds it busy
            busy = send_stream(port, {"prompt": doc + " Q: what else?",
                                      "max_tokens": ctx - n_doc - 64})
            until_first_event(busy)
            q = doc + " Q: who?"
            other = json.loads(curl(port, "/v1/completions", {"prompt": q, "max_tokens": 8},
                                    key=""))
            busy_then = metric(port, "kvpred_slots_busy")  # the long answer, still running
            busy.close()
        finally:
            stop(p)
        want, _ = run_cli(q, 8, ctx=ctx, extra=pol)
        check(busy_then == 1 and other["kvpred"]["prefix_reused"] >= n_doc - 16 and
              other["kvpred"]["kv_bytes_cold"] > 0,
              f"tiered slots: the document is copied from the busy slot ("
              f"{other['kvpred']['prefix_reused']} of {n_doc} tokens reused; busy {busy_then}, "
              f"cold {other['kvpred']['kv_bytes_cold']})")
        check(other["choices"][0]["text"] == want, "and the answer equals kvpred run's")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def kv_lost():
    """A slot whose KV lives in the disk tier (--kv-tier disk, quest 1/8: most blocks cold) and
    whose file is damaged under it between two requests: the next read of a damaged unit fails
    its checksum (KVP_EKVLOST); the server cuts the slot back to the tokens it still trusts,
    recomputes the rest, and answers what an undamaged run answers."""
    ctx = 2048
    doc = " ".join(f"Line {i}: the river was wide and the pass key is not here." for i in range(80))
    d = tempfile.mkdtemp(prefix="kvpred-tier-")
    pol = ["--policy", "quest", "--budget", "1/8"]
    try:
        p, port = start("-np", "1", "--kv-tier", "disk", "--kv-dir", d, "--hot-budget", "64", *pol,
                        key=None, ctx=ctx)
        try:
            first = json.loads(curl(port, "/v1/completions",
                                    {"prompt": doc + " Q: where?", "max_tokens": 8}, key=""))
            time.sleep(0.5)  # let the write-through of the last step land
            flipped = 0
            for fd in os.listdir(f"/proc/{p.pid}/fd"):
                try:
                    target = os.readlink(f"/proc/{p.pid}/fd/{fd}")
                except OSError:
                    continue
                if not target.startswith(d):
                    continue
                # one bit in every 4 KiB (a unit is a whole number of them) of what was written
                with open(f"/proc/{p.pid}/fd/{fd}", "r+b") as f:
                    size = f.seek(0, 2)
                    for off in range(100, size, 4096):
                        f.seek(off)
                        b = f.read(1)
                        f.seek(off)
                        f.write(bytes([b[0] ^ 0x04]))
                        flipped += 1
            q = doc + " Q: who?"
            got = json.loads(curl(port, "/v1/completions", {"prompt": q, "max_tokens": 8},
                                  key=""))
            lost = metric(port, "kvpred_kv_lost_total")
        finally:
            stop(p)
        err = p.stderr.read()
        want, _ = run_cli(q, 8, ctx=ctx, extra=pol)
        check(first["choices"][0]["text"] and flipped > 0 and lost is not None and lost >= 1
              and "lost data" in err,
              f"a damaged disk-tier file: the loss is found ({flipped} bits flipped, {lost} "
              f"recoveries; {err.strip().splitlines()[-3:]!r})")
        check(got["choices"][0]["text"] == want,
              "and the request is recomputed from the trusted tokens: the answer equals kvpred "
              "run's")
    finally:
        shutil.rmtree(d, ignore_errors=True)


def prefix_cache():
    """--kv-cache-dir: a document's prefix survives a restart, is checked when read back, and a
    damaged or foreign file is refused with one line and recomputed."""
    ctx = 4096
    doc = " ".join(f"Line {i}: the sky was blue and the pass key is not here." for i in range(180))
    d = tempfile.mkdtemp(prefix="kvpred-prefix-")

    def ask(port, q, n=8):
        return json.loads(curl(port, "/v1/completions", {"prompt": doc + q, "max_tokens": n}))
    try:
        p, port = start("--kv-cache-dir", d, ctx=ctx)
        cold = ask(port, "", 4)
        n_doc = cold["usage"]["prompt_tokens"]
        warm = ask(port, " Q: where?")
        rc = stop(p)
        files = [f for f in os.listdir(d) if f.endswith(".kvpfx")]
        check(rc == 0 and len(files) == 1, f"the document's prefix written to the folder: {files}")
        check(warm["kvpred"]["prefix_reused"] >= n_doc - 16, "warm follow-up reuses the document")

        p, port = start("--kv-cache-dir", d, ctx=ctx)
        again = ask(port, " Q: who?")
        prefilled = metric(port, "kvpred_prefill_tokens_total")
        want, _ = run_cli(doc + " Q: who?", 8, ctx=ctx)
        # the model ran only the question's tokens: the document was read back, not recomputed
        # (counted, not timed: a timing ratio fails on a loaded host; the TTFTs are shown)
        ttft = (cold["kvpred"]["ttft_ms"], again["kvpred"]["ttft_ms"])
        check(again["kvpred"]["prefix_reused"] >= n_doc - 16 and
              prefilled == again["usage"]["prompt_tokens"] - again["kvpred"]["prefix_reused"]
              and prefilled < 32,
              f"after a restart the prefix is read back: {prefilled:.0f} tokens prefilled, "
              f"TTFT {ttft[0]:.0f} -> {ttft[1]:.0f} ms")
        check(again["choices"][0]["text"] == want, "and the answer equals kvpred run's")
        stop(p)

        # flip one bit in the middle of the units: refused when read, prompt recomputed
        path = os.path.join(d, files[0])
        with open(path, "r+b") as f:
            size = f.seek(0, 2)
            f.seek(size // 2)
            b = f.read(1)
            f.seek(size // 2)
            f.write(bytes([b[0] ^ 0x10]))
        p, port = start("--kv-cache-dir", d, ctx=ctx)
        bad = ask(port, " Q: who?")
        stop(p)
        err = p.stderr.read()
        check(bad["kvpred"]["prefix_reused"] == 0 and bad["choices"][0]["text"] == want and
              err.count("refused") == 1,
              "a flipped bit: refused with one line, recomputed (and stored afresh), same answer "
              f"(reused {bad['kvpred']['prefix_reused']}, log {err!r})")

        # a file of another KV type is left alone and not used; a truncated one is refused
        p, port = start("--kv-cache-dir", d, ctx=ctx)
        ask(port, "", 4)
        stop(p)
        path = os.path.join(d, [f for f in os.listdir(d) if f.endswith(".kvpfx")][0])
        p, port = start("--kv-cache-dir", d, "-ctk", "f32", ctx=ctx)
        other = ask(port, " Q: who?")
        stop(p)
        err = p.stderr.read()
        check(other["kvpred"]["prefix_reused"] == 0 and "another KV type" in err and
              os.path.exists(path), "a file of another KV type: refused, kept for its owner")
        with open(path, "r+b") as f:
            f.truncate(f.seek(0, 2) - 100)
        p, port = start("--kv-cache-dir", d, ctx=ctx)
        trunc = ask(port, " Q: who?")
        stop(p)
        err = p.stderr.read()
        check(trunc["kvpred"]["prefix_reused"] == 0 and "wrong size" in err and
              trunc["choices"][0]["text"] == want, "a truncated file: refused, recomputed")
    finally:
        shutil.rmtree(d, ignore_errors=True)
    # a full disk (a 1 MiB tmpfs, where root may mount one): the write fails, said once, the
    # server goes on from RAM
    tiny = tempfile.mkdtemp(prefix="kvpred-tiny-")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", tiny],
                      capture_output=True).returncode != 0:
        print("skipped: the full-disk case (cannot mount a small tmpfs here)")
        note_skip("the full-disk case (cannot mount a small tmpfs here)")
    else:
        try:
            p, port = start("--kv-cache-dir", tiny, ctx=ctx)
            ask(port, "", 4)
            second = ask(port, " Q: who?")
            t0 = time.time()
            while time.time() - t0 < 120 and metric(port, "kvpred_prefix_cache_persistent") != 0:
                time.sleep(0.05)
            persistent = metric(port, "kvpred_prefix_cache_persistent")
            third = ask(port, " Q: when?")
            stop(p)
            err = p.stderr.read()
            check(persistent == 0 and err.count("serving without a persistent") == 1 and
                  second["kvpred"]["prefix_reused"] > 0 and third["kvpred"]["prefix_reused"] > 0
                  and not [f for f in os.listdir(tiny) if f.endswith(".tmp")],
                  "a full disk: said once, no partial file left, prefixes still reused from RAM")
        finally:
            subprocess.run(["umount", tiny], capture_output=True)
            shutil.rmtree(tiny, ignore_errors=True)
    # a folder that cannot be used: said once, served from RAM
    p, port = start("--kv-cache-dir", "/proc/kvpred-no-such-dir", ctx=ctx)
    r = ask(port, "", 4)
    stop(p)
    err = p.stderr.read()
    check(r["usage"]["prompt_tokens"] > 0 and err.count("serving without a persistent") == 1,
          "an unusable folder: one line, and the server serves")


main()
