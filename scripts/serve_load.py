#!/usr/bin/env python3
"""Load test for `megatron serve` (stdlib only).

N client threads (default 32) send `PUT /api` requests back to back against a running
server for a fixed duration, then the script prints requests served, errors and latency
percentiles. Loopback by default; every request has a timeout, so the run is bounded.

    python3 scripts/serve_load.py --port 5000 --clients 32 --duration 60 --prompt "1 2 3" --tokens 16
"""

import argparse
import http.client
import json
import threading
import time


def worker(args, deadline, lat, errors, lock):
    body = json.dumps({"prompts": [args.prompt], "tokens_to_generate": args.tokens, "top_k": args.top_k,
                       "no_log": True})
    while time.monotonic() < deadline:
        t0 = time.monotonic()
        try:
            conn = http.client.HTTPConnection(args.host, args.port, timeout=args.timeout)
            conn.request("PUT", "/api", body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
            ok = resp.status == 200 and "text" in json.loads(data)
        except Exception as e:  # a timeout or reset counts as an error, the run goes on
            ok = False
            data = repr(e).encode()
        dt = time.monotonic() - t0
        with lock:
            if ok:
                lat.append(dt)
            else:
                errors.append(data[:200])


def pct(sorted_lat, p):
    if not sorted_lat:
        return float("nan")
    i = min(len(sorted_lat) - 1, int(round(p / 100.0 * (len(sorted_lat) - 1))))
    return sorted_lat[i]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=5000)
    ap.add_argument("--clients", type=int, default=32)
    ap.add_argument("--duration", type=float, default=60.0, help="seconds")
    ap.add_argument("--prompt", default="Hello world")
    ap.add_argument("--tokens", type=int, default=16, help="tokens_to_generate per request")
    ap.add_argument("--top-k", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=120.0, help="per-request timeout, seconds")
    args = ap.parse_args()

    lat, errors, lock = [], [], threading.Lock()
    start = time.monotonic()
    deadline = start + args.duration
    threads = [threading.Thread(target=worker, args=(args, deadline, lat, errors, lock), daemon=True)
               for _ in range(args.clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=args.duration + args.timeout + 5)
    wall = time.monotonic() - start
    lat.sort()
    print(f"clients {args.clients}, duration {wall:.1f}s, tokens_to_generate {args.tokens}")
    print(f"requests served {len(lat)}, errors {len(errors)}, throughput {len(lat) / wall:.2f} req/s")
    print(f"latency p50 {pct(lat, 50) * 1e3:.1f} ms, p99 {pct(lat, 99) * 1e3:.1f} ms, max "
          f"{(lat[-1] if lat else float('nan')) * 1e3:.1f} ms")
    if errors:
        print(f"first error: {errors[0]!r}")


if __name__ == "__main__":
    main()
