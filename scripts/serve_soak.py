#!/usr/bin/env python3
"""Soak test of a running `megatron serve` (issue 21, item 4; stdlib only).

CLIENTS threads (default 64) hammer the server for DURATION seconds, each with one role
(by thread index), while one more thread polls GET /health every 250 ms and a sampler reads
the server's RSS from /proc/PID/status every second:

  normal    POST /v1/completions, mixed temperature/top_p/seed/n/max_tokens/logprobs
  stream    POST /v1/completions with "stream": true, read to `data: [DONE]`
  chat      POST /v1/chat/completions, streamed or not
  api       PUT /api (Megatron's protocol)
  slowread  streams and reads one line every 0.2 s (the engine pauses only this sequence)
  drop      streams and closes the socket after the first event, or right after sending
  slowwrite sends its body in pieces over ~2 s (a slow uplink)
  malformed broken JSON, wrong types, out-of-range values, unknown model/path/method,
            oversized bodies, garbage request lines, truncated bodies, prompts too long

Pass/fail: zero 5xx answers, zero unanswered or broken answers to well-formed requests
(429 = back-pressure is allowed: the client retries), every malformed request answered 4xx
(or the connection closed, for garbage that is not HTTP), /health answering every poll.
Prints one RESULT line (JSON) with the counts, /health latency, and the RSS trace / peak.

    python3 scripts/serve_soak.py --port 5000 --pid $SERVER_PID --clients 64 --duration 60
"""

import argparse
import http.client
import json
import random
import socket
import threading
import time

ROLES = ["normal", "stream", "chat", "api", "slowread", "drop", "slowwrite", "malformed"]


class Stats:
    def __init__(self):
        self.lock = threading.Lock()
        self.by_role = {r: {} for r in ROLES}
        self.failures = []

    def add(self, role, outcome):
        with self.lock:
            d = self.by_role[role]
            d[outcome] = d.get(outcome, 0) + 1

    def fail(self, role, what):
        with self.lock:
            if sum(f.startswith(role + ":") for f in self.failures) < 3:
                self.failures.append(f"{role}: {what}")
            d = self.by_role[role]
            d["FAIL"] = d.get("FAIL", 0) + 1


def prompt(rng, vocab):
    return " ".join(str(rng.randrange(1, vocab - 1)) for _ in range(rng.randint(1, 24)))


def completion_body(rng, vocab, stream):
    b = {"prompt": prompt(rng, vocab), "max_tokens": rng.randint(1, 32), "stream": stream}
    if rng.random() < 0.5:
        b["temperature"] = round(rng.uniform(0, 1.5), 2)
    if rng.random() < 0.3:
        b["top_p"] = round(rng.uniform(0.1, 1), 2)
    if rng.random() < 0.5:
        b["seed"] = rng.randrange(1 << 30)
    if not stream and rng.random() < 0.2:
        b["n"] = 2
    if rng.random() < 0.2:
        b["logprobs"] = 2
    return b


def conn(args, timeout=None):
    return http.client.HTTPConnection(args.host, args.port, timeout=timeout or args.timeout)


def check_status(stats, role, status, data=b""):
    if status >= 500:
        stats.fail(role, f"HTTP {status}: {data[:150]!r}")
        return False
    if status == 429:
        stats.add(role, "429")
        time.sleep(0.1)
        return False
    if status != 200:
        stats.fail(role, f"HTTP {status} for a well-formed request: {data[:150]!r}")
        return False
    return True


def do_json(args, rng, stats, role, method, path, body, check):
    c = conn(args)
    c.request(method, path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    if check_status(stats, role, r.status, data):
        v = json.loads(data)
        if not check(v):
            stats.fail(role, f"answer without the expected fields: {data[:150]!r}")
        else:
            stats.add(role, "200")


def do_stream(args, rng, stats, role, path, body, pause=0.0, drop_after=None):
    c = conn(args)
    c.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    sock = c.sock  # the response takes it over (close-delimited body)
    r = c.getresponse()
    if r.status != 200:
        check_status(stats, role, r.status, r.read())
        c.close()
        return
    events, done = 0, False
    while True:
        line = r.fp.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            events += 1
            if line.strip() == b"data: [DONE]":
                done = True
                break
            if drop_after is not None and events >= drop_after:
                sock.shutdown(socket.SHUT_RDWR)  # gone mid-stream: the server must free the slot
                r.close()
                sock.close()
                stats.add(role, "dropped")
                return
        if pause:
            time.sleep(pause)
    c.close()
    if done:
        stats.add(role, "200")
    else:
        stats.fail(role, f"stream ended after {events} events without [DONE]")


def raw(args, data, read=True, timeout=None):
    s = socket.create_connection((args.host, args.port), timeout=timeout or args.timeout)
    try:
        s.sendall(data)
        if not read:
            return None
        s.shutdown(socket.SHUT_WR)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            out += chunk
        return out
    finally:
        s.close()


def malformed_case(rng, vocab):
    j = lambda b: json.dumps(b).encode()
    cases = [
        ("POST", "/v1/completions", b"{not json"),
        ("POST", "/v1/completions", j({"prompt": "1 2", "max_tokens": "lots"})),
        ("POST", "/v1/completions", j({"prompt": "1 2", "temperature": 5})),
        ("POST", "/v1/completions", j({"prompt": "1 2", "model": "gpt-9"})),
        ("POST", "/v1/completions", j({"prompt": "1 2", "max_tokens": -3})),
        ("POST", "/v1/completions", j({"prompt": " ".join(["5"] * 5000), "max_tokens": 8})),
        ("POST", "/v1/completions", j({"max_tokens": 8})),
        ("POST", "/v1/completions", j({"prompt": [], "max_tokens": 8})),
        ("POST", "/v1/completions", j({"prompt": "1", "n": 1000})),
        ("POST", "/v1/chat/completions", j({"messages": "hi"})),
        ("POST", "/v1/chat/completions", j({"messages": [{"role": 7}]})),
        ("PUT", "/api", j({"prompts": "not a list", "tokens_to_generate": 4})),
        ("PUT", "/api", j({"prompts": ["1 2"], "tokens_to_generate": 100000})),
        ("PUT", "/api", j({"prompts": ["1"], "top_k": 5, "top_p": 0.5})),
        ("POST", "/v1/nothing", j({})),
        ("DELETE", "/v1/completions", b""),
        ("POST", "/v1/completions", b"x" * (5 << 20)),
    ]
    return rng.choice(cases)


def worker(args, idx, deadline, stats):
    role = ROLES[idx % len(ROLES)]
    rng = random.Random(args.seed * 1000 + idx)
    v = args.vocab
    while time.monotonic() < deadline:
        try:
            if role == "normal":
                b = completion_body(rng, v, False)
                do_json(args, rng, stats, role, "POST", "/v1/completions", b, lambda r: "choices" in r and "usage" in r)
            elif role == "stream":
                do_stream(args, rng, stats, role, "/v1/completions", completion_body(rng, v, True))
            elif role == "chat":
                b = {"messages": [{"role": "user", "content": prompt(rng, v)}], "max_tokens": rng.randint(1, 24)}
                if rng.random() < 0.5:
                    b["stream"] = True
                    do_stream(args, rng, stats, role, "/v1/chat/completions", b)
                else:
                    do_json(args, rng, stats, role, "POST", "/v1/chat/completions", b, lambda r: "choices" in r)
            elif role == "api":
                b = {"prompts": [prompt(rng, v)], "tokens_to_generate": rng.randint(1, 24), "top_k": rng.choice([0, 1, 5])}
                do_json(args, rng, stats, role, "PUT", "/api", b, lambda r: "text" in r and "tokens" in r)
            elif role == "slowread":
                b = completion_body(rng, v, True)
                b["max_tokens"] = 64  # more than the engine's read-ahead bound of 32 events
                do_stream(args, rng, stats, role, "/v1/completions", b, pause=0.2)
            elif role == "drop":
                b = completion_body(rng, v, True)
                b["max_tokens"] = 32
                if rng.random() < 0.5:
                    do_stream(args, rng, stats, role, "/v1/completions", b, drop_after=1)
                else:
                    body = json.dumps(b).encode()
                    head = f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
                    raw(args, head.encode() + body, read=False)
                    stats.add(role, "sent-and-closed")
            elif role == "slowwrite":
                body = json.dumps(completion_body(rng, v, False)).encode()
                s = socket.create_connection((args.host, args.port), timeout=args.timeout)
                s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n".encode())
                step = max(1, len(body) // 8)
                for i in range(0, len(body), step):
                    time.sleep(0.25)
                    s.sendall(body[i:i + step])
                out = b""
                while True:
                    chunk = s.recv(65536)
                    if not chunk:
                        break
                    out += chunk
                s.close()
                status = int(out.split(b" ", 2)[1]) if out.startswith(b"HTTP/1.1 ") else 0
                if status == 0:
                    stats.fail(role, f"no HTTP answer: {out[:100]!r}")
                elif check_status(stats, role, status, out):
                    stats.add(role, "200")
            else:  # malformed
                kind = rng.random()
                if kind < 0.15:
                    out = raw(args, bytes(rng.randrange(256) for _ in range(rng.randint(1, 300))) + b"\r\n\r\n")
                    stats.add(role, "garbage-" + (out[9:12].decode() if out.startswith(b"HTTP/1.1 ") else "closed"))
                    if out.startswith(b"HTTP/1.1 5"):
                        stats.fail(role, f"5xx for garbage: {out[:100]!r}")
                    continue
                if kind < 0.25:
                    # Declares more body than it sends, then closes its side: no answer is owed.
                    out = raw(args, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{\"pro")
                    if out and out.startswith(b"HTTP/1.1 5"):
                        stats.fail(role, f"5xx for a truncated body: {out[:100]!r}")
                    stats.add(role, "truncated")
                    continue
                method, path, body = malformed_case(rng, v)
                c = conn(args)
                try:
                    c.request(method, path, body=body, headers={"Content-Type": "application/json"})
                    r = c.getresponse()
                    data = r.read()
                    status = r.status
                except (ConnectionError, BrokenPipeError):
                    status = "reset"  # the server refused a 5 MiB body before reading it all
                    data = b""
                c.close()
                if status == "reset" or (isinstance(status, int) and 400 <= status < 500):
                    stats.add(role, str(status))
                else:
                    stats.fail(role, f"{method} {path}: HTTP {status} for a malformed request: {data[:150]!r}")
        except Exception as e:  # a timeout or reset of a well-formed request is a failure
            stats.fail(role, repr(e)[:200])


def health(args, deadline, out):
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            c = conn(args, timeout=5)
            c.request("GET", "/health")
            r = c.getresponse()
            v = json.loads(r.read())
            c.close()
            ok = r.status == 200 and v.get("status") == "ok"
            out["max_active"] = max(out.get("max_active", 0), v.get("active", 0))
            out["max_queued"] = max(out.get("max_queued", 0), v.get("queued", 0))
            out["last"] = v
        except Exception as e:
            ok = False
            out.setdefault("errors", []).append(repr(e)[:100])
        dt = time.monotonic() - t0
        out["polls"] = out.get("polls", 0) + 1
        out["ok"] = out.get("ok", 0) + int(ok)
        out.setdefault("lat", []).append(dt)
        time.sleep(0.25)


def rss_sampler(pid, deadline, out):
    while time.monotonic() < deadline + 1:
        try:
            with open(f"/proc/{pid}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        out.append(int(line.split()[1]))
        except OSError:
            out.append(-1)
            return
        time.sleep(1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, help="server pid, for its RSS")
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--vocab", type=int, default=100, help="prompts are ids below it (NullTokenizer)")
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request socket timeout, seconds")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()

    stats, hstats, rss = Stats(), {}, []
    deadline = time.monotonic() + args.duration
    threads = [threading.Thread(target=worker, args=(args, i, deadline, stats)) for i in range(args.clients)]
    threads.append(threading.Thread(target=health, args=(args, deadline, hstats)))
    if args.pid:
        threads.append(threading.Thread(target=rss_sampler, args=(args.pid, deadline, rss)))
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.monotonic() - t0
    peak = None
    if args.pid:
        try:
            with open(f"/proc/{args.pid}/status") as f:
                peak = next((int(l.split()[1]) for l in f if l.startswith("VmHWM:")), None)
        except OSError:
            peak = None
    lat = sorted(hstats.get("lat", [0]))
    failures = sum(d.get("FAIL", 0) for d in stats.by_role.values())
    health_ok = hstats.get("ok", 0) == hstats.get("polls", -1)
    q = lambda p: lat[min(len(lat) - 1, int(p * (len(lat) - 1)))]
    n = len(rss)
    result = {
        "clients": args.clients,
        "wall_s": round(wall, 1),
        "by_role": stats.by_role,
        "failures": failures,
        "first_failures": stats.failures,
        "health": {"polls": hstats.get("polls", 0), "ok": hstats.get("ok", 0),
                   "p50_ms": round(q(0.5) * 1000, 1), "max_ms": round(lat[-1] * 1000, 1),
                   "max_active": hstats.get("max_active"), "max_queued": hstats.get("max_queued"),
                   "last": hstats.get("last"), "errors": hstats.get("errors", [])[:5]},
        "rss_kib": {"samples": n, "start": rss[0] if rss else None, "max": max(rss) if rss else None,
                    "end": rss[-1] if rss else None, "peak_vmhwm": peak,
                    "trace_0_25_50_75_100": [rss[int(p * (n - 1))] for p in (0, .25, .5, .75, 1)] if n else []},
    }
    print("RESULT " + json.dumps(result))
    ok = failures == 0 and health_ok
    print("SOAK PASSED" if ok else "SOAK FAILED")
    raise SystemExit(0 if ok else 1)


if __name__ == "__main__":
    main()
