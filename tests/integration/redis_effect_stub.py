"""An order service whose idempotency keys and effects live only in Redis, for the Redis count,
fairness and CLIENT PAUSE tests. Standard library only.
Usage: redis_effect_stub.py PORT REDIS_URL MODE

A request: GET record -> SET lock NX PX (its first write) -> GET record again (a request that
lost the race to a finished one replays) -> INCR effects -> SET record -> DEL lock. A request
that finds the lock taken and no record answers 409 "in progress". Modes:
- correct: the effect is counted once per key (one INCR).
- double: the effect is applied twice behind one id (two INCRs), while every answer stays
  right: only a count of the Redis effects sees it.
A body without "sku" is refused with 422 before any Redis command (a racer that never writes);
a body with "stall_ms" makes the request wait that long before its first Redis command (a racer
that reaches Redis late).
"""
import json
import socket
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
URL = sys.argv[2][len("redis://"):]
MODE = sys.argv[3]
HOSTPORT, _, DB = URL.partition("/")
HOST, _, RPORT = HOSTPORT.rpartition(":")
PREFIX = "tfv-fx:"


class Redis:
    def __init__(self):
        self.sock = socket.create_connection((HOST, int(RPORT)))
        self.f = self.sock.makefile("rb")
        self.cmd("SELECT", DB or "0")

    def cmd(self, *args):
        parts = [b"*%d\r\n" % len(args)]
        for a in args:
            b = str(a).encode()
            parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
        self.sock.sendall(b"".join(parts))
        line = self.f.readline()
        kind, value = line[:1], line[1:-2]
        if kind == b"+":
            return value.decode()
        if kind == b"-":
            raise RuntimeError(value.decode())
        if kind == b":":
            return int(value)
        if kind == b"$":
            n = int(value)
            if n < 0:
                return None
            return self.f.read(n + 2)[:-2].decode()
        raise RuntimeError("unexpected reply %r" % line)


local = threading.local()


def redis():
    if not hasattr(local, "conn"):
        local.conn = Redis()
    return local.conn


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body, headers=()):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.answer(200, {"ok": True})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if "sku" not in body:
            return self.answer(422, {"error": "sku is required"})
        if body.get("stall_ms"):
            time.sleep(body["stall_ms"] / 1000.0)
        key = self.headers["Idempotency-Key"]
        rec, lock, effects = PREFIX + "rec:" + key, PREFIX + "lock:" + key, PREFIX + "effects:" + key
        r = redis()
        record = r.cmd("GET", rec)
        if record is not None:
            return self.answer(201, json.loads(record), [("Idempotent-Replayed", "true")])
        if r.cmd("SET", lock, "1", "NX", "PX", "10000") is None:
            record = r.cmd("GET", rec)
            if record is not None:
                return self.answer(201, json.loads(record), [("Idempotent-Replayed", "true")])
            return self.answer(409, {"error": "a request with this key is in progress"})
        # The lock is ours: a request that finished between our GET and our SET NX has stored
        # its answer, so look again before acting.
        record = r.cmd("GET", rec)
        if record is not None:
            r.cmd("DEL", lock)
            return self.answer(201, json.loads(record), [("Idempotent-Replayed", "true")])
        order = {"id": str(uuid.uuid4())}
        r.cmd("INCR", effects)
        if MODE == "double":
            r.cmd("INCR", effects)
        r.cmd("SET", rec, json.dumps(order))
        r.cmd("DEL", lock)
        self.answer(201, order)


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
