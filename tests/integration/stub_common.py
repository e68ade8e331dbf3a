"""What the Redis-backed test stubs (redis_lock_stub.py, redis_effect_stub.py,
ttl_lock_stub.py, poll_stub.py) share: a minimal RESP2 client, one connection per thread or
one shared pipelined connection, and an HTTP handler base that answers JSON (pg_cancel_stub.py,
on PostgreSQL, uses that too). Standard library only; imported from the stubs' own folder.
"""
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler


def encode(args):
    """One command in RESP2."""
    parts = [b"*%d\r\n" % len(args)]
    for a in args:
        b = str(a).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(b), b))
    return b"".join(parts)


class Redis:
    """One connection to the Redis of a `redis://HOST:PORT[/DB]` URL, that database selected."""

    def __init__(self, url):
        hostport, _, db = url[len("redis://"):].partition("/")
        host, _, port = hostport.rpartition(":")
        self.sock = socket.create_connection((host, int(port)))
        self.f = self.sock.makefile("rb")
        self.cmd("SELECT", db or "0")

    def cmd(self, *args):
        """Sends one command; returns its reply (str, int, or None for nil). Raises
        RuntimeError on an error reply, ConnectionError when the connection is gone."""
        self.sock.sendall(encode(args))
        return self.reply()

    def reply(self):
        """Reads one reply (str, int, None for nil, or a list of replies for an array, as
        `EXEC` and `MGET` answer). Raises RuntimeError on an error reply (outside an array),
        ConnectionError when the connection is gone."""
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
        if kind == b"*":
            n = int(value)
            if n < 0:
                return None
            # An element that is an error (a command of an EXEC that failed) is its message.
            return [self._element() for _ in range(n)]
        if not line:
            raise ConnectionError("connection lost")
        raise RuntimeError("unexpected reply %r" % line)


    def _element(self):
        try:
            return self.reply()
        except RuntimeError as e:
            return e


class Shared:
    """One connection to `url` for every thread, as node-redis and ioredis keep by default:
    each thread's command is written as soon as it is issued (pipelined behind the others'),
    and a reader thread hands the replies out in order."""

    def __init__(self, url):
        self.conn = Redis(url)
        self.send = threading.Lock()
        self.waiting = []
        self.ready = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        while True:
            with self.ready:
                while not self.waiting:
                    self.ready.wait()
                slot = self.waiting[0]
            try:
                slot["reply"] = self.conn.reply()
            except Exception as e:  # noqa: BLE001 -- handed to the waiting thread
                slot["error"] = e
            with self.ready:
                self.waiting.pop(0)
                slot["done"] = True
                self.ready.notify_all()

    def cmd(self, *args):
        slot = {"done": False}
        with self.send:
            with self.ready:
                self.waiting.append(slot)
                self.ready.notify_all()
            self.conn.sock.sendall(encode(args))
        with self.ready:
            while not slot["done"]:
                self.ready.wait()
        if "error" in slot:
            raise slot["error"]
        return slot["reply"]


_local = threading.local()


def per_thread(url):
    """This thread's connection to `url`, opened on first use."""
    if not hasattr(_local, "conn"):
        _local.conn = Redis(url)
    return _local.conn


def forget():
    """Drops this thread's connection (it broke): the next `per_thread` opens a new one."""
    if hasattr(_local, "conn"):
        del _local.conn


class JsonHandler(BaseHTTPRequestHandler):
    """HTTP/1.1, no access log, `answer` in JSON, and GET (the ready path) answered 200."""

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
