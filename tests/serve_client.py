"""What the server tests and scripts share to drive `kvpred serve`: start and stop a server on a
free loopback port, raw HTTP on a fresh socket (so that the tests see exactly what the server
sends, chunking, SSE comments and all), /metrics as a dict, the text of an answer streamed or
not, and `kvpred run`'s answer to compare with.

Imported by tests/test_server_*.py (beside it), scripts/soak_server.py and
scripts/bench_serve_ttft.py (which put this folder on their path). `check` counts and reports
what a test says must hold; `run_parts` is a test's main.
"""
import json
import os
import signal
import socket
import subprocess
import sys
import time


_passed = 0


def check(cond, what):
    """One checked statement: "ok: ..." or "FAIL: ..." and exit 1."""
    global _passed
    if not cond:
        print(f"FAIL: {what}", flush=True)
        sys.exit(1)
    _passed += 1
    print(f"ok: {what}", flush=True)


def passed():
    return _passed


def run_parts(parts, namespace, model):
    """A test's main: skip (exit 77) without the model outside CI, fail without it under
    CI=true; run each named part (a function in namespace), timed; print the count."""
    if not os.path.exists(model):
        check(os.environ.get("CI") not in ("true", "1"), f"no model at {model}")
        print("skipped: no model at", model)
        log = os.environ.get("KVP_SKIP_LOG")  # scripts/test.sh counts the skips
        if log:
            with open(log, "a") as f:
                f.write(f"{os.path.basename(sys.argv[0])}: no model at {model}\n")
        sys.exit(77)
    for part in parts:
        t0 = time.time()
        namespace[part]()
        print(f"-- {part}: {time.time() - t0:.1f} s", flush=True)
    print(f"{_passed} passed, 0 failed")


def start(kvpred, model, *extra, ctx=None):
    """`kvpred serve` on a free port: (process, port). Exits the caller when it does not start."""
    args = [kvpred, "serve", "-m", model, "--port", "0"]
    if ctx is not None:
        args += ["-c", str(ctx)]
    p = subprocess.Popen(args + [str(a) for a in extra], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    if not line.startswith("listening "):
        print("server did not start:", line, p.stderr.read(), flush=True)
        sys.exit(1)
    return p, int(line.split()[1])


def stop(p, timeout=120):
    """SIGTERM, then wait (SIGKILL after timeout): (exit code, stderr); None for a hang."""
    p.send_signal(signal.SIGTERM)
    try:
        rc = p.wait(timeout)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
        rc = None
    return rc, p.stderr.read()


def sanitizer_report(err):
    """True when a server's stderr holds an AddressSanitizer or UBSan report."""
    return "Sanitizer" in err or "runtime error:" in err


def dechunk(b):
    out = b""
    while b:
        size, _, b = b.partition(b"\r\n")
        try:
            n = int(size.split(b";")[0], 16)
        except ValueError:
            break
        if n == 0:
            break
        out += b[:n]
        b = b[n + 2:]
    return out


def request_bytes(port, method, path, body=None):
    data = None if body is None else json.dumps(body).encode()
    h = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{port}", "Connection: close"]
    if data is not None:
        h += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
    return ("\r\n".join(h) + "\r\n\r\n").encode() + (data or b"")


def http(port, method, path, body=None, timeout=120, src=None):
    """One request on a fresh socket: (status, head, body) with the body de-chunked, or
    (0, error, b"") when the connection failed or closed without an answer."""
    try:
        s = socket.create_connection(("127.0.0.1", port), timeout=timeout,
                                     source_address=(src, 0) if src else None)
        s.sendall(request_bytes(port, method, path, body))
        out = b""
        while (b := s.recv(65536)):
            out += b
        s.close()
    except OSError as e:
        return 0, str(e), b""
    head, _, rest = out.partition(b"\r\n\r\n")
    if not head:
        return 0, "closed without an answer", b""
    if b"chunked" in head.lower():
        rest = dechunk(rest)
    return int(head.split()[1]), head.decode(), rest


def metrics(port, timeout=120):
    """/metrics as {series: value} (series with their labels, as the text names them)."""
    _, _, body = http(port, "GET", "/metrics", timeout=timeout)
    out = {}
    for line in body.decode(errors="replace").splitlines():
        if line and not line.startswith("#"):
            k, v = line.rsplit(" ", 1)
            out[k] = float(v)
    return out


def sse_text(raw, chat=False):
    """A stream's generated text and whether it ended with `data: [DONE]`. SSE comments (lines
    starting with ':') are skipped, as clients do."""
    text, done = "", False
    for ev in raw.split("\n\n"):
        if not ev.startswith("data: "):
            continue
        if ev[6:] == "[DONE]":
            done = True
            continue
        for c in json.loads(ev[6:]).get("choices", []):
            text += (c.get("delta", {}).get("content") or "") if chat else c.get("text", "")
    return text, done


def answer_text(raw, chat=False, stream=False):
    """The generated text of an answer's body (bytes or str); for a stream None when it has no
    `data: [DONE]`."""
    if isinstance(raw, bytes):
        raw = raw.decode()
    if not stream:
        j = json.loads(raw)
        return j["choices"][0]["message"]["content"] if chat else j["choices"][0]["text"]
    text, done = sse_text(raw, chat)
    return text if done else None


def run_cli(kvpred, model, prompt, n, ctx, chat=False, timeout=600):
    """`kvpred run`'s greedy answer: the text after the prompt (completions), or the whole
    output (chat: the template's text, then the answer and a newline) as bytes."""
    args = [kvpred, "run", "-m", model, "-c", str(ctx), "-p", prompt, "-n", str(n),
            "--temp", "0"] + (["--chat"] if chat else [])
    out = subprocess.run(args, capture_output=True, timeout=timeout).stdout
    if chat:
        return out
    assert out.startswith(prompt.encode()), out[:80]
    return out[len(prompt.encode()):-1].decode("utf-8", "replace")


def timed(fn):
    t0 = time.perf_counter()
    r = fn()
    return time.perf_counter() - t0, r
