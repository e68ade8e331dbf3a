"""A small order service for the fault tests: its idempotency keys live in Redis as GET record
-> SET lock NX [PX ttl] -> INCR -> SET record -> DEL lock. A request that loses its Redis
connection after taking the lock leaves the lock behind: with a TTL it expires and a retry
creates; with TTL 0 the lock never expires and the key answers "in progress" forever.
Standard library only. Usage: ttl_lock_stub.py PORT REDIS_URL TTL_MS
"""
import json
import socket
import sys
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PORT = int(sys.argv[1])
URL = sys.argv[2][len("redis://"):]
TTL_MS = int(sys.argv[3])
HOSTPORT, _, DB = URL.partition("/")
HOST, _, RPORT = HOSTPORT.rpartition(":")


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
        raise ConnectionError("connection lost (reply %r)" % line)


local = threading.local()


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
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        key = self.headers["Idempotency-Key"]
        try:
            if not hasattr(local, "conn"):
                local.conn = Redis()
            self.create(local.conn, key)
        except (OSError, RuntimeError) as e:
            # The connection is gone: the next request opens a new one.
            if hasattr(local, "conn"):
                del local.conn
            self.answer(503, {"error": str(e)})

    def create(self, r, key):
        record = r.cmd("GET", "tfv-ttl:rec:" + key)
        if record is not None:
            return self.answer(201, json.loads(record), [("Idempotent-Replayed", "true")])
        lock = ["SET", "tfv-ttl:lock:" + key, "1", "NX"]
        if TTL_MS > 0:
            lock += ["PX", str(TTL_MS)]
        if r.cmd(*lock) is None:
            return self.answer(409, {"error": "a request with this key is in progress"})
        order = {"id": str(uuid.uuid4())}
        r.cmd("INCR", "tfv-ttl:orders:" + key)
        r.cmd("SET", "tfv-ttl:rec:" + key, json.dumps(order))
        r.cmd("DEL", "tfv-ttl:lock:" + key)
        self.answer(201, order)


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
