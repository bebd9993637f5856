#!/usr/bin/env python3
"""Several questions on one document through `kvpred serve`: the answers equal those of
`kvpred eval --task T --questions N` (greedy, docs/evaluation.md) in the follow-up mode the
server uses for the policy (keep: full, quest, oracle, random; recompute: the others).

For each document i, `kvpred prompt --task T --questions N --sample i` gives the document and its
questions; each question is sent as a /v1/completions request whose prompt is the document
followed by the question (one slot, so every request after the first finds the document in the
slot's cache: the response's prompt_tokens_details.cached_tokens says how many prompt tokens
were reused). Each answer must equal eval's: the server's text starts with eval's answer and
goes on, if at all, with the newline eval stops at. /v1/completions rather than
/v1/chat/completions: the shipped model has no chat template, and the plain one ("User: ...",
"Assistant:") would wrap the prompt in text eval does not decode; the slot reuse is the same for
both endpoints. Exits 1 on the first difference.

  scripts/serve_check_multiq.py [--task niah_single] [--length 2048] [--questions 4] [--docs 2]
                                [--policy quest --budget 1/16]
"""
import argparse
import json
import os
import signal
import subprocess
import sys
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MAX_NEW = {"passkey": 16, "niah_single": 128, "niah_multikey": 128}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kvpred", default=os.path.join(ROOT, "build", "kvpred"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "kvpred-default.gguf"))
    ap.add_argument("--task", default="niah_single", choices=sorted(MAX_NEW))
    ap.add_argument("--length", type=int, default=2048)
    ap.add_argument("--questions", type=int, default=4)
    ap.add_argument("--docs", type=int, default=2)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--policy", default="full")
    ap.add_argument("--budget", default="1/16")
    a = ap.parse_args()
    max_new = MAX_NEW[a.task]
    common = ["-m", a.model, "--task", a.task, "--seed", str(a.seed)]
    pol = ["--policy", a.policy] + (["--budget", a.budget] if a.policy != "full" else [])

    def evaluate(follow_up):
        ev = subprocess.run([a.kvpred, "eval"] + common + pol + [
            "--questions", str(a.questions), "--lengths", str(a.length), "--samples",
            str(a.docs), "--follow-up", follow_up, "-t", "1", "--json"], check=True,
            capture_output=True, text=True)
        return [json.loads(line) for line in ev.stdout.splitlines() if line.startswith("{")]

    # eval's mode the server follows for this policy (server_follow_up): the kept document, or
    # the document prefilled again for every question
    rows = evaluate("keep")
    mode = rows[0]["server_follow_up"]
    if mode != "keep":
        rows = evaluate(mode)
    want = {r["question"]: r["answers"] for r in rows}
    # the context eval gives its documents: the length, the answer and one
    p = subprocess.Popen([a.kvpred, "serve", "-m", a.model, "--port", "0", "-c",
                          str(a.length + max_new + 1), "-np", "1", "-t", "1"] + pol,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    bad = total = 0
    try:
        port = int(p.stdout.readline().split()[1])
        for i in range(a.docs):
            doc = json.loads(subprocess.run(
                [a.kvpred, "prompt"] + common + ["--questions", str(a.questions), "--length",
                                                 str(a.length), "--sample", str(i)],
                check=True, capture_output=True, text=True).stdout)
            for q, question in enumerate(doc["questions"]):
                body = json.dumps({"prompt": doc["document"] + question, "max_tokens": max_new,
                                   "temperature": 0}).encode()
                req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", body,
                                             {"Content-Type": "application/json"})
                with urllib.request.urlopen(req, timeout=1800) as r:
                    j = json.load(r)
                text = j["choices"][0]["text"]
                cached = j["usage"].get("prompt_tokens_details", {}).get("cached_tokens")
                ans = want[q + 1][i]
                ok = text.startswith(ans) and (len(text) == len(ans) or text[len(ans)] == "\n")
                bad += not ok
                total += 1
                print(f"document {i} question {q + 1}: {'same' if ok else 'DIFFERENT'} "
                      f"(eval {ans!r}, reference {doc['references'][q]}, prompt "
                      f"{j['usage']['prompt_tokens']} tokens, {cached} reused)"
                      + ("" if ok else f": server {text!r}"), flush=True)
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait(120)
    print(f"{a.task} {a.policy}: {total - bad} of {total} answers the same as eval --questions "
          f"--follow-up {mode}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
