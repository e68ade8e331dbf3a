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
import sys
import time
import uuid
from http.server import ThreadingHTTPServer

from stub_common import JsonHandler, per_thread

PORT = int(sys.argv[1])
URL = sys.argv[2]
MODE = sys.argv[3]
PREFIX = "tfv-fx:"


class Handler(JsonHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
        if "sku" not in body:
            return self.answer(422, {"error": "sku is required"})
        if body.get("stall_ms"):
            time.sleep(body["stall_ms"] / 1000.0)
        key = self.headers["Idempotency-Key"]
        rec, lock, effects = PREFIX + "rec:" + key, PREFIX + "lock:" + key, PREFIX + "effects:" + key
        r = per_thread(URL)
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
