"""A small order service for the interposer tests, with a known defect: its idempotency keys
live in Redis as GET record -> SET lock NX -> create -> SET record -> DEL lock, so a request
whose GET ran before the record existed and whose SET NX runs after the DEL takes a fresh lock
and creates a second order. Standard library only. Usage: redis_lock_stub.py PORT REDIS_URL
"""
import json
import sys
import uuid
from http.server import ThreadingHTTPServer

from stub_common import JsonHandler, per_thread

PORT = int(sys.argv[1])
URL = sys.argv[2]


class Handler(JsonHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        key = self.headers["Idempotency-Key"]
        r = per_thread(URL)
        record = r.cmd("GET", "tfv-stub:rec:" + key)
        if record is not None:
            return self.answer(201, json.loads(record), [("Idempotent-Replayed", "true")])
        if r.cmd("SET", "tfv-stub:lock:" + key, "1", "NX", "PX", "10000") is None:
            return self.answer(409, {"error": "a request with this key is in progress"})
        order = {"id": str(uuid.uuid4())}
        r.cmd("INCR", "tfv-stub:orders:" + key)
        r.cmd("SET", "tfv-stub:rec:" + key, json.dumps(order))
        r.cmd("DEL", "tfv-stub:lock:" + key)
        self.answer(201, order)


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
