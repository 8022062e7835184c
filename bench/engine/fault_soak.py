#!/usr/bin/env python3
"""Load with faults against a running `slime_train serve` (docs/benchmarks.md, "Load with faults").

Rounds of N concurrent clients; client i of a round is
  i % 3 == 0: a plain /generate that must answer 200 with its tokens,
  i % 3 == 1: a streamed /generate whose client closes the socket after the first chunk,
  i % 3 == 2: a /generate with its own rid, aborted by POST /abort_request shortly after it
              starts (it must answer 200, finished or with finish_reason "abort").
Checks, exit 1 on any failure: every plain and aborted request answered as above; between
rounds and at the end no K/V page is held by a request (slime_engine_kv_pages_used equals
slime_engine_kv_pages_cached once the server is idle); after /flush_cache every page is free
again; the server's resident memory after the soak is within --rss-slack-mb of its value after
the warm-up round. Prints one JSON line with the figures.

  bench/engine/fault_soak.py --url 127.0.0.1:PORT --pid PID [--rounds 5] [--clients 300]
"""
import argparse
import http.client
import json
import socket
import sys
import threading
import time


def metrics(host, port):
    conn = http.client.HTTPConnection(host, port, timeout=30)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    out = {}
    for line in text.splitlines():
        if line.startswith("slime_engine_kv_pages_") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name.split("{")[0]] = float(value)
    return out


def rss_mb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def post(host, port, path, body, timeout=120):
    conn = http.client.HTTPConnection(host, port, timeout=timeout)
    conn.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    r = conn.getresponse()
    data = r.read()
    conn.close()
    return r.status, data


def request_body(i, args, **extra):
    body = {
        "input_ids": [(7 * i + j) % 200 + 10 for j in range(args.prompt_len)],
        "sampling_params": {"max_new_tokens": args.new_tokens, "temperature": 1.0,
                            "ignore_eos": True},
    }
    body.update(extra)
    return body


def plain(i, args, host, port, errors):
    status, data = post(host, port, "/generate", request_body(i, args))
    if status != 200:
        errors.append(f"client {i}: plain /generate answered {status}: {data[:200]!r}")
        return
    reply = json.loads(data)
    if len(reply.get("output_ids", [])) != args.new_tokens:
        errors.append(f"client {i}: {len(reply.get('output_ids', []))} tokens, expected {args.new_tokens}")


def disconnect(i, args, host, port, errors):
    body = json.dumps(request_body(i, args, stream=True)).encode()
    s = socket.create_connection((host, port), timeout=60)
    s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    got = b""
    while b"data:" not in got:
        chunk = s.recv(4096)
        if not chunk:
            errors.append(f"client {i}: the stream ended before its first chunk")
            break
        got += chunk
    s.close()  # mid-stream: the server must drop the request and free its pages


def abort(i, args, host, port, errors, round_id):
    rid = f"soak-{round_id}-{i}"
    result = {}

    def run():
        result["reply"] = post(host, port, "/generate", request_body(i, args, rid=rid))

    t = threading.Thread(target=run)
    t.start()
    time.sleep(args.abort_after)
    status, _ = post(host, port, "/abort_request", {"rid": rid})
    if status != 200:
        errors.append(f"client {i}: /abort_request answered {status}")
    t.join(300)
    if "reply" not in result:
        errors.append(f"client {i}: the aborted /generate never answered")
        return
    status, data = result["reply"]
    if status != 200:
        errors.append(f"client {i}: aborted /generate answered {status}: {data[:200]!r}")
        return
    reason = json.loads(data).get("meta_info", {}).get("finish_reason", {}) or {}
    if reason.get("type") not in ("abort", "length"):
        errors.append(f"client {i}: finish_reason {reason}")


def run_round(round_id, args, host, port, errors):
    threads = []
    kinds = [plain, disconnect, None]
    for i in range(args.clients):
        kind = kinds[i % 3]
        if kind is None:
            t = threading.Thread(target=abort, args=(i, args, host, port, errors, round_id))
        else:
            t = threading.Thread(target=kind, args=(i, args, host, port, errors))
        threads.append(t)
        t.start()
    for t in threads:
        t.join(600)


def wait_idle(host, port, deadline_s):
    """K/V pages held by requests (used - cached) once the server is idle, waiting up to deadline_s."""
    end = time.time() + deadline_s
    while True:
        m = metrics(host, port)
        held = m.get("slime_engine_kv_pages_used", 0) - m.get("slime_engine_kv_pages_cached", 0)
        if held == 0 or time.time() > end:
            return held, m
        time.sleep(0.2)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--url", required=True, help="HOST:PORT of the serve")
    p.add_argument("--pid", type=int, required=True, help="the serve's pid (resident memory)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--clients", type=int, default=300)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--abort-after", type=float, default=0.05, help="seconds before the abort")
    p.add_argument("--rss-slack-mb", type=float, default=64.0)
    args = p.parse_args()
    host, port = args.url.rsplit(":", 1)
    port = int(port)
    errors = []
    start = time.time()
    run_round("warmup", args, host, port, errors)
    held, _ = wait_idle(host, port, 30)
    base_rss = rss_mb(args.pid)
    total_pages = sum(v for k, v in metrics(host, port).items()
                      if k in ("slime_engine_kv_pages_used", "slime_engine_kv_pages_free"))
    rounds = []
    for r in range(args.rounds):
        t = time.time()
        run_round(r, args, host, port, errors)
        held, m = wait_idle(host, port, 30)
        rounds.append({"round": r, "seconds": round(time.time() - t, 2), "held_pages": held,
                       "rss_mb": round(rss_mb(args.pid), 1)})
        if held != 0:
            errors.append(f"round {r}: {held} K/V pages still held by requests after the round ({m})")
    status, _ = post(host, port, "/flush_cache", {})
    after_flush = metrics(host, port)
    end_rss = rss_mb(args.pid)
    if status != 200:
        errors.append(f"/flush_cache answered {status}")
    if after_flush.get("slime_engine_kv_pages_used", -1) != 0:
        errors.append(f"after /flush_cache {after_flush.get('slime_engine_kv_pages_used')} pages are used")
    if after_flush.get("slime_engine_kv_pages_free", -1) != total_pages:
        errors.append(f"after /flush_cache {after_flush.get('slime_engine_kv_pages_free')} of {total_pages} pages are free")
    if end_rss > base_rss + args.rss_slack_mb:
        errors.append(f"resident memory {end_rss:.1f} MB after the soak, {base_rss:.1f} MB after the warm-up")
    summary = {
        "rounds": args.rounds, "clients_per_round": args.clients,
        "requests": (args.rounds + 1) * args.clients,
        "disconnected": (args.rounds + 1) * ((args.clients + 1) // 3),
        "aborted": (args.rounds + 1) * (args.clients // 3),
        "seconds": round(time.time() - start, 1), "rss_mb_after_warmup": round(base_rss, 1),
        "rss_mb_at_end": round(end_rss, 1), "kv_pages": total_pages,
        "kv_pages_used_after_flush": after_flush.get("slime_engine_kv_pages_used"),
        "per_round": rounds, "errors": errors[:20], "error_count": len(errors),
    }
    print(json.dumps(summary))
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
