#!/usr/bin/env python3
"""ctest test_prefix_store: `kvpred serve --prefix-store` against a Redis Cluster of 3 masters
and 3 replicas started here on free loopback ports. Two servers share a document's KV: one
prefills it, the other (and both after a restart with nothing in RAM and no folder) copies it in;
a flipped bit in a stored block (its first, a middle and its last unit) is refused and recomputed;
an evicted block is recomputed and stored again; a master killed as a read begins is read around
through its replica; two servers prefilling one document at once store one copy; a store that is
not there is said once and the server answers from its own cache. Every answer is compared with
`kvpred run`'s, exactly (both run the same calls in the same order).

usage: test_prefix_store.py KVPRED_BINARY SOURCE_DIR   (exit 0: passed; 77: skipped)
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

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_client as sc  # noqa: E402
from serve_client import check  # noqa: E402

KVPRED, SRC = sys.argv[1], sys.argv[2]
MODEL = os.path.join(SRC, "models", "kvpred-default.gguf")
CTX = 4096
BS = 16              # KV block size (the default): the store keeps whole blocks
NODE_TIMEOUT_MS = 3000


def skip(why):
    """A missing input: under CI=true the run fails naming it; elsewhere the test is skipped,
    said on stdout and counted in $KVP_SKIP_LOG (scripts/test.sh prints the count)."""
    if os.environ.get("CI") in ("true", "1"):
        print(f"FAIL (CI): {why}")
        sys.exit(1)
    print(f"skipped: {why}")
    note_skip(why)
    sys.exit(77)


def note_skip(why):
    """Count a skip where scripts/test.sh reads them ($KVP_SKIP_LOG)."""
    log = os.environ.get("KVP_SKIP_LOG")
    if log:
        with open(log, "a") as f:
            f.write("test_prefix_store.py: " + why + "\n")


# ---- a minimal RESP client (binary values, so not redis-cli) ----------------------------------

def resp(port, *args, timeout=10):
    sk = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    out = b"*%d\r\n" % len(args)
    for a in args:
        a = a if isinstance(a, bytes) else str(a).encode()
        out += b"$%d\r\n%s\r\n" % (len(a), a)
    sk.sendall(out)
    f = sk.makefile("rb")

    def read():
        line = f.readline()[:-2]
        t, rest = line[:1], line[1:]
        if t == b"+":
            return rest.decode()
        if t == b"-":
            return RuntimeError(rest.decode())
        if t == b":":
            return int(rest)
        if t == b"$":
            n = int(rest)
            if n < 0:
                return None
            v = f.read(n + 2)[:-2]
            return v
        if t == b"*":
            n = int(rest)
            return None if n < 0 else [read() for _ in range(n)]
        raise RuntimeError(f"odd reply {line!r}")
    try:
        return read()
    finally:
        sk.close()


def port_free(p):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", p))
        return True
    except OSError:
        return False
    finally:
        s.close()


def redis_server(port, d, *extra):
    """A redis-server on 127.0.0.1:port without persistence, its files in d, once it answers
    PING (the caller stops it)."""
    p = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                          "--appendonly", "no", "--dir", d, *extra],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(200):
        try:
            if resp(port, "PING") == "PONG":
                break
        except OSError:
            time.sleep(0.05)
    return p


class Cluster:
    """Six redis-servers in cluster mode: 3 masters, one replica each."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="kvpred-pstore-redis-")
        self.procs, self.ports = {}, []
        # free ports whose cluster bus port (+10000) is free too, away from test_redis's picks
        p = 21000 + os.getpid() % 3000
        while len(self.ports) < 6:
            p += 1
            if port_free(p) and port_free(p + 10000):
                self.ports.append(p)
        for port in self.ports:
            self.procs[port] = redis_server(
                port, self.dir, "--cluster-enabled", "yes", "--cluster-config-file",
                f"nodes-{port}.conf", "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--cluster-require-full-coverage", "no")
        r = subprocess.run(["redis-cli", "--cluster", "create",
                            *[f"127.0.0.1:{p}" for p in self.ports], "--cluster-replicas", "1",
                            "--cluster-yes"], capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError("redis-cli --cluster create: " + r.stdout[-500:] + r.stderr[-500:])
        self.wait_ok(3, 1)
        self.url = f"redis://127.0.0.1:{self.ports[0]},127.0.0.1:{self.ports[1]}"

    def slots(self, port):
        return resp(port, "CLUSTER", "SLOTS")

    def wait_ok(self, masters, replicas, timeout=60):
        t0 = time.time()
        while time.time() - t0 < timeout:
            good = 0
            for port in self.live():
                try:
                    info = resp(port, "CLUSTER", "INFO")
                    sl = self.slots(port)
                except (OSError, RuntimeError):
                    continue
                if (isinstance(info, bytes) and b"cluster_state:ok" in info and
                        isinstance(sl, list) and len(sl) == masters and
                        all(len(r) >= 3 + replicas and r[2][1] in self.live() for r in sl)):
                    good += 1
            if good == len(self.live()):
                return
            time.sleep(0.1)
        raise RuntimeError("the cluster did not settle")

    def live(self):
        return [p for p in self.ports if self.procs[p].poll() is None]

    def masters(self):
        return sorted({r[2][1] for r in self.slots(self.live()[0])})

    def keys(self):
        """Every stored block: {key: value} over the masters."""
        out = {}
        for m in self.masters():
            cursor = b"0"
            while True:
                cursor, ks = resp(m, "SCAN", cursor, "MATCH", "kvpfx:*", "COUNT", 1000)
                for k in ks:
                    out[k] = resp(m, "GET", k)
                if cursor == b"0":
                    break
        return out

    def owner(self, key):
        slot = resp(self.live()[0], "CLUSTER", "KEYSLOT", key)
        for r in self.slots(self.live()[0]):
            if r[0] <= slot <= r[1]:
                return r[2][1]
        return None

    def replicas_caught_up(self, timeout=30):
        t0 = time.time()
        while time.time() - t0 < timeout:
            sl = self.slots(self.live()[0])
            if all(resp(r[2][1], "DBSIZE") == resp(rep[1], "DBSIZE") for r in sl
                   for rep in r[3:]):
                return True
            time.sleep(0.1)
        return False

    def kill(self, port):
        self.procs[port].send_signal(signal.SIGKILL)
        self.procs[port].wait()

    def close(self):
        for p in self.procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


# ---- the server -----------------------------------------------------------------------------

def start(url, *extra):
    return sc.start(KVPRED, MODEL, "--timeout", "3", "--prefix-store", url, *extra, ctx=CTX)


def stop(p):
    """SIGTERM; the server must exit 0 with no sanitizer report (ASan builds): its stderr."""
    rc, err = sc.stop(p)
    if rc != 0 or sc.sanitizer_report(err):
        print(f"FAIL: the server exited {rc}: {err[-3000:]}", flush=True)
        sys.exit(1)
    return err


def ask(port, prompt, n=8):
    body = json.dumps({"prompt": prompt, "max_tokens": n})
    out = subprocess.run(["curl", "-sS", "-d", body, f"http://127.0.0.1:{port}/v1/completions"],
                         capture_output=True, text=True, timeout=600).stdout
    return json.loads(out)


def metric(port, name):
    out = subprocess.run(["curl", "-sS", f"http://127.0.0.1:{port}/metrics"],
                         capture_output=True, text=True, timeout=60).stdout
    for line in out.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    return None


def wait_written(port, want, timeout=60):
    """The writer has stored (or found stored) `want` blocks."""
    t0 = time.time()
    got = 0
    while time.time() - t0 < timeout:
        got = (metric(port, "kvpred_prefix_store_blocks_written_total") +
               metric(port, "kvpred_prefix_store_blocks_shared_total"))
        if got >= want:
            return got
        time.sleep(0.05)
    return got


def run_cli(prompt, n):
    args = [KVPRED, "run", "-m", MODEL, "-c", str(CTX), "-p", prompt, "-n", str(n), "--temp",
            "0"]
    out = subprocess.run(args, capture_output=True, timeout=600).stdout
    assert out.startswith(prompt.encode()), out[:80]
    return out[len(prompt.encode()):-1].decode("utf-8", "replace")


def text(r):
    return r["choices"][0]["text"]


def prefilled(port):
    return metric(port, "kvpred_prefill_tokens_total")


HDR = 64 + 4 * BS + 8


class SlowProxy:
    """A TCP proxy in front of one Redis server that holds every byte a client sends for
    `delay` seconds while delay is set: a store that answers slowly, for as long as the test
    wants, without blocking the Redis server behind it."""

    def __init__(self, target):
        self.target, self.delay = target, 0.0
        self.ls = socket.create_server(("127.0.0.1", 0))
        self.port = self.ls.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while True:
            try:
                c, _ = self.ls.accept()
                s = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                return
            threading.Thread(target=self.pump, args=(c, s, True), daemon=True).start()
            threading.Thread(target=self.pump, args=(s, c, False), daemon=True).start()

    def pump(self, a, b, slow):
        try:
            while (d := a.recv(65536)):
                if slow and self.delay > 0:
                    time.sleep(self.delay)
                b.sendall(d)
        except OSError:
            pass
        for x in (a, b):
            try:
                x.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self):
        self.ls.close()


def slow_store(doc, q, want):
    """A store that takes DELAY seconds to answer a lookup holds back only the request that
    waits for it: a request that arrives after it, on the other slot, is answered meanwhile."""
    delay = 4.0
    port = 21500 + os.getpid() % 2000
    while not port_free(port):
        port += 1
    d = tempfile.mkdtemp(prefix="kvpred-pstore-slow-")
    rs = redis_server(port, d)
    px = None
    try:
        px = SlowProxy(port)
        c, pc = start(f"redis://127.0.0.1:{px.port}?timeout_ms=30000", "-np", "2",
                      "--cache-ram", "0")
        short = "Once upon a time"  # under the store's 32 tokens: never looked up
        want_short = run_cli(short, 8)
        ask(pc, short)  # warm: the weights and the slot
        res = {}
        px.delay = delay
        t0 = time.time()
        slow = threading.Thread(target=lambda: res.__setitem__("doc", (ask(pc, doc + q),
                                                                       time.time() - t0)))
        slow.start()
        time.sleep(0.3)  # the document's lookup is now held by the proxy
        t1 = time.time()
        r = ask(pc, short)
        t_short = time.time() - t1
        slow.join()
        px.delay = 0
        err = stop(c)
        r_doc, t_doc = res["doc"]
        # before the store's read left the scheduler, the short request waited for the lookup
        # (delay - 0.3 s); a slot's own time for it is ~0.1 s: half the delay parts the two
        check(text(r) == want_short and t_short < delay / 2 and t_doc >= delay and
              text(r_doc) == want and "refused" not in err,
              f"a store {delay:.0f} s slow to answer: a short request on the other slot is "
              f"answered in {t_short:.2f} s meanwhile; the document's answer ({t_doc:.1f} s) "
              "equals kvpred run's")
    finally:
        if px:
            px.close()
        rs.kill()
        rs.wait()
        shutil.rmtree(d, ignore_errors=True)


def block_index(v):
    return int.from_bytes(v[12:16], "little")


def main():
    if not os.path.exists(MODEL):
        skip(f"no default model at {MODEL}")
    if not shutil.which("redis-server") or not shutil.which("redis-cli"):
        skip("redis-server / redis-cli not installed (scripts/install-deps.sh)")
    doc = " ".join(f"Line {i}: the sky was blue and the pass key is not here." for i in range(170))
    q = " Q: who?"
    want = run_cli(doc + q, 8)

    # ---- no store there: one line, the metric, the server serves from its own cache
    port = 21000
    while not port_free(port):
        port += 1
    c = subprocess.Popen([KVPRED, "serve", "-m", MODEL, "--port", "0", "-c", str(CTX),
                          "--prefix-store", f"redis://127.0.0.1:{port}"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = c.stdout.readline()
    if not line.startswith("listening "):
        err = c.stderr.read()
        c.wait()
        if "without hiredis" in err:
            skip("kvpred was built without hiredis")
        check(False, f"the server starts with a store that is not there: {err}")
    pc = int(line.split()[1])
    r1, r2 = ask(pc, doc + q), ask(pc, doc + " Q: where?")
    bad = [subprocess.run([KVPRED, "serve", "-m", MODEL, "--port", "0", "--prefix-store", u],
                          capture_output=True, text=True, timeout=120)
           for u in ("http://127.0.0.1:1", "redis://127.0.0.1", "redis://127.0.0.1:1?ttl_s=x",
                     "redis://127.0.0.1:1?colour=red")]
    check(all(b.returncode != 0 and "--prefix-store" in b.stderr for b in bad),
          "a bad store URL (scheme, port, option value, unknown option): refused at start with "
          f"one message ({bad[1].stderr.strip()!r})")
    up = metric(pc, "kvpred_prefix_store_up")
    err = stop(c)
    check(text(r1) == want and r2["kvpred"]["prefix_reused"] > 0 and up == 0 and
          err.count("unreachable") == 1,
          f"a store that is not there: said once, up 0, served from RAM ({err.strip()[-160:]!r})")

    slow_store(doc, q, want)

    cl = Cluster()
    servers = []
    try:
        # ---- one server prefills, the other copies in
        a, pa = start(cl.url)
        b, pb = start(cl.url)
        servers += [a, b]
        cold = ask(pa, doc, 4)
        n_doc = cold["usage"]["prompt_tokens"]
        nb = n_doc // BS
        check(wait_written(pa, nb) == nb, f"the first server stored the document's {nb} blocks")
        warm = ask(pb, doc + q)
        pre = prefilled(pb)
        ttft = (cold["kvpred"]["ttft_ms"], warm["kvpred"]["ttft_ms"])
        check(warm["kvpred"]["prefix_reused"] == nb * BS and
              pre == warm["usage"]["prompt_tokens"] - nb * BS and text(warm) == want,
              f"the second server copies the document in ({warm['kvpred']['prefix_reused']} of "
              f"{n_doc} tokens, {pre:.0f} prefilled, TTFT {ttft[0]:.0f} -> {ttft[1]:.0f} ms) and "
              "answers as kvpred run")
        keys = cl.keys()
        check(len(keys) == nb and sorted(block_index(v) for v in keys.values()) == list(range(nb)),
              f"one stored copy: {len(keys)} keys for {nb} blocks")
        stop(a)
        stop(b)

        # ---- both restarted: nothing in RAM, no folder, still shared
        a, pa = start(cl.url)
        b, pb = start(cl.url)
        servers += [a, b]
        ra, rb = ask(pa, doc + q), ask(pb, doc + q)
        check(all(r["kvpred"]["prefix_reused"] == nb * BS and text(r) == want for r in (ra, rb)) and
              prefilled(pa) == prefilled(pb) == ra["usage"]["prompt_tokens"] - nb * BS,
              "after both restart the document is copied in by each, same answer")
        stop(a)
        stop(b)

        # ---- a flipped bit in the first, a middle and the last unit: refused, recomputed, stored
        # again (a server with no RAM cache, restarted for each, so the store is asked each time)
        by_block = {block_index(v): k for k, v in cl.keys().items()}
        unit = (len(next(iter(keys.values()))) - HDR) // 4  # 4 layers: unit + its checksum
        cases = [("first unit", 0, HDR + 3),
                 ("a middle unit", nb // 2, HDR + 2 * unit + (unit - 8) // 2),
                 ("the last unit", nb - 1, HDR + 4 * unit - 9)]
        for name, blk, off in cases:
            k = by_block[blk]
            owner = cl.owner(k)
            v = bytearray(resp(owner, "GET", k))
            v[off] ^= 0x08
            resp(owner, "SET", k, bytes(v))
            c, pc = start(cl.url, "--cache-ram", "0")
            got = ask(pc, doc + q)
            refused = metric(pc, "kvpred_prefix_store_refused_total")
            rewritten = wait_written(pc, nb - blk)
            err = stop(c)
            fixed = cl.keys().get(k)
            check(got["kvpred"]["prefix_reused"] == blk * BS and text(got) == want and
                  refused == 1 and err.count("refused block") == 1 and rewritten >= nb - blk and
                  fixed is not None and fixed != bytes(v),
                  f"a flipped bit in {name} of block {blk}: refused (one line), the prompt "
                  f"prefilled from token {blk * BS}, same answer, the block stored again")

        c, pc = start(cl.url, "--cache-ram", "0")
        got = ask(pc, doc + q)
        refused = metric(pc, "kvpred_prefix_store_refused_total")
        stop(c)
        check(got["kvpred"]["prefix_reused"] == nb * BS and refused == 0 and text(got) == want,
              "the blocks stored again pass their checks: the whole document is copied in")

        # ---- an evicted block inside the document: the prefix ends there, it is stored again
        k = by_block[nb // 3]
        resp(cl.owner(k), "DEL", k)
        c, pc = start(cl.url, "--cache-ram", "0")
        got = ask(pc, doc + q)
        wait_written(pc, nb - nb // 3)
        stop(c)
        check(got["kvpred"]["prefix_reused"] == (nb // 3) * BS and text(got) == want and
              len(cl.keys()) == nb, f"an evicted block {nb // 3}: recomputed from there, same "
              "answer, stored again")

        # ---- a master killed as the read begins: read from its replica
        check(cl.replicas_caught_up(), "the replicas hold every block")
        victim = cl.owner(by_block[0])
        c, pc = start(cl.url, "--cache-ram", "0")
        killer = threading.Timer(0.005, cl.kill, args=(victim,))
        killer.start()
        got = ask(pc, doc + q)
        killer.join()
        stop(c)
        check(got["kvpred"]["prefix_reused"] == nb * BS and text(got) == want,
              f"master :{victim} killed during the read: the blocks came from its replica "
              f"({got['kvpred']['prefix_reused']} tokens reused), same answer")
        cl.wait_ok(3, 0)

        # ---- two servers prefilling one new document at once: one copy, no torn read
        doc2 = " ".join(f"Row {i}: a green field and no pass key in sight." for i in range(150))
        want2 = run_cli(doc2 + q, 8)
        a, pa = start(cl.url)
        b, pb = start(cl.url)
        servers += [a, b]
        before = len(cl.keys())
        res = {}
        ths = [threading.Thread(target=lambda p=p: res.__setitem__(p, ask(p, doc2 + q)))
               for p in (pa, pb)]
        for t in ths:
            t.start()
        for t in ths:
            t.join()
        nb2 = (res[pa]["usage"]["prompt_tokens"]) // BS
        both = all(res[p]["kvpred"]["prefix_reused"] == 0 for p in (pa, pb))
        t0 = time.time()
        written = 0
        while time.time() - t0 < 60 and written < nb2:
            written = (metric(pa, "kvpred_prefix_store_blocks_written_total") +
                       metric(pb, "kvpred_prefix_store_blocks_written_total"))
            time.sleep(0.05)
        if both:  # the later writer finds every block there: its SETs leave them as they are
            wait_written(pb, nb2)
            wait_written(pa, nb2)
        time.sleep(0.2)
        written = (metric(pa, "kvpred_prefix_store_blocks_written_total") +
                   metric(pb, "kvpred_prefix_store_blocks_written_total"))
        after = len(cl.keys())
        check(text(res[pa]) == want2 and text(res[pb]) == want2 and written == nb2 and
              after - before == nb2,
              f"two servers on one document at once (both prefilled it: {both}): both answer as "
              f"kvpred run, {nb2} blocks stored once ({written:.0f} SETs won, "
              f"{after - before} new keys)")
        third = ask(pb, doc2 + " Q: where?")
        check(third["kvpred"]["prefix_reused"] >= nb2 * BS - BS,
              "and it is reused afterwards")
        stop(a)
        stop(b)
    finally:
        for p in servers:
            if p.poll() is None:
                p.kill()
        cl.close()

    print(f"{sc.passed()} passed, 0 failed")


main()
