"""A small order service for the fault tests: its idempotency keys live in Redis as GET record
-> SET lock NX [PX ttl] -> INCR -> SET record -> DEL lock. A request that loses its Redis
connection after taking the lock leaves the lock behind: with a TTL it expires and a retry
creates; with TTL 0 the lock never expires and the key answers "in progress" forever.
With TTL_STUB_ON_ERROR=exit in its environment it behaves like a Node service whose store
client has no error listener: a lost connection ends the process (status 3, a line on
stderr) instead of answering 503.
Standard library only. Usage: ttl_lock_stub.py PORT REDIS_URL TTL_MS
"""
import json
import os
import sys
import uuid
from http.server import ThreadingHTTPServer

from stub_common import JsonHandler, forget, per_thread

PORT = int(sys.argv[1])
URL = sys.argv[2]
TTL_MS = int(sys.argv[3])


class Handler(JsonHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        key = self.headers["Idempotency-Key"]
        try:
            self.create(per_thread(URL), key)
        except (OSError, RuntimeError) as e:
            if os.environ.get("TTL_STUB_ON_ERROR") == "exit":
                print("fatal: unhandled store error: %s" % e, file=sys.stderr, flush=True)
                os._exit(3)
            # The connection is gone: the next request opens a new one.
            forget()
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
