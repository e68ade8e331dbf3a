"""A small order service for the fault tests: its idempotency keys live in Redis as GET record
-> SET lock NX [PX ttl] -> INCR -> SET record -> DEL lock. A request that loses its Redis
connection after taking the lock leaves the lock behind: with a TTL it expires and a retry
creates; with TTL 0 the lock never expires and the key answers "in progress" forever.
With TTL_STUB_ON_ERROR=exit in its environment it behaves like a Node service whose store
client has no error listener: a lost connection ends the process (status 3, a line on
stderr) instead of answering 503. With TTL_STUB_ON_ERROR=resend it behaves like ioredis or
redis-rb: a command whose connection was lost is sent again, once, on a new connection, and
the request goes on as if nothing had happened. With TTL_STUB_SHARED=1 every request's
commands go over one shared, pipelined connection (node-redis's and ioredis's default).
Standard library only. Usage: ttl_lock_stub.py PORT REDIS_URL TTL_MS
"""
import json
import os
import sys
import uuid
from http.server import ThreadingHTTPServer

from stub_common import JsonHandler, Shared, forget, per_thread

PORT = int(sys.argv[1])
URL = sys.argv[2]
TTL_MS = int(sys.argv[3])
SHARED = Shared(URL) if os.environ.get("TTL_STUB_SHARED") == "1" else None


class Handler(JsonHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        key = self.headers["Idempotency-Key"]
        try:
            self.create(per_thread(URL) if SHARED is None else None, key)
        except (OSError, RuntimeError) as e:
            if os.environ.get("TTL_STUB_ON_ERROR") == "exit":
                print("fatal: unhandled store error: %s" % e, file=sys.stderr, flush=True)
                os._exit(3)
            # The connection is gone: the next request opens a new one.
            forget()
            self.answer(503, {"error": str(e)})

    def cmd(self, r, *args):
        """One command on this thread's connection (`r` until a resend replaced it), or on the
        shared one."""
        if SHARED is not None:
            return SHARED.cmd(*args)
        try:
            return per_thread(URL).cmd(*args)
        except (OSError, ConnectionError):
            if os.environ.get("TTL_STUB_ON_ERROR") != "resend":
                raise
            forget()
            return per_thread(URL).cmd(*args)

    def create(self, r, key):
        record = self.cmd(r, "GET", "tfv-ttl:rec:" + key)
        if record is not None:
            return self.answer(201, json.loads(record), [("Idempotent-Replayed", "true")])
        lock = ["SET", "tfv-ttl:lock:" + key, "1", "NX"]
        if TTL_MS > 0:
            lock += ["PX", str(TTL_MS)]
        if self.cmd(r, *lock) is None:
            return self.answer(409, {"error": "a request with this key is in progress"})
        order = {"id": str(uuid.uuid4())}
        self.cmd(r, "INCR", "tfv-ttl:orders:" + key)
        self.cmd(r, "SET", "tfv-ttl:rec:" + key, json.dumps(order))
        self.cmd(r, "DEL", "tfv-ttl:lock:" + key)
        self.answer(201, order)


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
