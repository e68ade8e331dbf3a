"""A small order service whose duplicates poll, for the conductor's fairness test: a request
that finds the key's lock taken polls the record (GET, every 5 ms, up to 3 s) until the
first request stores it, then replays it. GET record -> SET lock NX PX -> GET record again
under the lock -> INCR -> SET record -> DEL lock. Correct: one order per key. Standard
library only.
Usage: poll_stub.py PORT REDIS_URL
"""
import json
import sys
import time
import uuid
from http.server import ThreadingHTTPServer

from stub_common import JsonHandler, forget, per_thread

PORT = int(sys.argv[1])
URL = sys.argv[2]


class Handler(JsonHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        key = self.headers["Idempotency-Key"]
        try:
            self.create(per_thread(URL), key)
        except (OSError, RuntimeError) as e:
            forget()
            self.answer(503, {"error": str(e)})

    def create(self, r, key):
        record = r.cmd("GET", "tfv-poll:rec:" + key)
        if record is not None:
            return self.answer(201, json.loads(record), [("Idempotent-Replayed", "true")])
        if r.cmd("SET", "tfv-poll:lock:" + key, "1", "NX", "PX", "10000") is None:
            # Another request holds the key: wait for its record.
            until = time.monotonic() + 3.0
            while time.monotonic() < until:
                record = r.cmd("GET", "tfv-poll:rec:" + key)
                if record is not None:
                    return self.answer(201, json.loads(record), [("Idempotent-Replayed", "true")])
                time.sleep(0.005)
            return self.answer(409, {"error": "a request with this key is in progress"})
        record = r.cmd("GET", "tfv-poll:rec:" + key)
        if record is not None:
            # Stored between our first look and the lock.
            r.cmd("DEL", "tfv-poll:lock:" + key)
            return self.answer(201, json.loads(record), [("Idempotent-Replayed", "true")])
        order = {"id": str(uuid.uuid4())}
        r.cmd("INCR", "tfv-poll:orders:" + key)
        r.cmd("SET", "tfv-poll:rec:" + key, json.dumps(order))
        r.cmd("DEL", "tfv-poll:lock:" + key)
        self.answer(201, order)


ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()
