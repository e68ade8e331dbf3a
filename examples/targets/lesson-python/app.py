"""lesson-python: a small TicketFlow service that follows the savepoint protocol.

The protocol is described in docs/PROTOCOL.md §4 of this repository.

It exists to be raced by TicketFlow Verify's black-box scenarios: run two instances against one
PostgreSQL database and send them the same Idempotency-Key at once.

    POST /v1/tickets   headers X-Tenant-Id, Idempotency-Key; JSON {actor_id, title, body, priority}
        201 created · 201 + ``Idempotent-Replayed: true`` replayed (same id) · 409 key used with
        another body · 400/413/422 invalid request (nothing written) · 500 database error,
        including "unique violation but the winner's receipt is invisible" (problem+json body
        with the SQLSTATE) · 503 no database connection in time
    GET /healthz       200 once the database answers

The whole create is ONE transaction, begun with ``BEGIN ISOLATION LEVEL <--isolation>``:
receipt lookup; if absent, a SAVEPOINT around ticket + ``ticket.created`` outbox row + receipt;
on the receipt's unique violation (23505) ROLLBACK TO SAVEPOINT and read the winner's receipt.
That re-read is only guaranteed to see the winner at READ COMMITTED; at REPEATABLE READ and
SERIALIZABLE the service answers 500 instead, on purpose: it does not retry the transaction, so
the harness can show the isolation caveat (docs/PROTOCOL.md §7). Request bodies are never logged.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import psycopg
from psycopg import errors
from psycopg_pool import ConnectionPool, PoolTimeout

from fingerprint import fingerprint

ISOLATION_LEVELS = {
    "read-committed": "READ COMMITTED",
    "repeatable-read": "REPEATABLE READ",
    "serializable": "SERIALIZABLE",
}
PRIORITIES = ("low", "normal", "high", "urgent")
REQUEST_FIELDS = ("actor_id", "title", "body", "priority")
MAX_ID_BYTES = 255          # tenant, key, actor
MAX_TITLE_CHARS = 200
MAX_BODY_BYTES = 64 * 1024  # the ticket body field
MAX_REQUEST_BYTES = 256 * 1024
RECEIPT_CONSTRAINT = "idempotency_receipts_pkey"

SELECT_RECEIPT = (
    "SELECT payload_hash, ticket_id FROM idempotency_receipts"
    " WHERE tenant_id = %s AND idempotency_key = %s"
)
TICKET_COLUMNS = "id, tenant_id, actor_id, title, body, priority, status, version, created_at, updated_at"


class Reply:
    """An HTTP answer: status, extra headers, JSON document."""

    def __init__(self, status: int, doc: dict, headers: dict | None = None, problem: bool = False):
        self.status = status
        self.doc = doc
        self.headers = headers or {}
        self.content_type = "application/problem+json" if problem else "application/json"


def problem(status: int, title: str, detail: str, **extra) -> Reply:
    doc = {"type": "about:blank", "title": title, "status": status, "detail": detail, **extra}
    return Reply(status, doc, problem=True)


class Invalid(Exception):
    """A request refused before any transaction; nothing is written."""

    def __init__(self, status: int, detail: str):
        super().__init__(detail)
        self.status = status
        self.detail = detail


class WinnerInvisible(Exception):
    """The receipt insert hit the unique constraint, yet this transaction cannot read the
    receipt that caused it: the winner committed after this transaction's snapshot."""

    def __init__(self, cause: errors.UniqueViolation):
        super().__init__(cause.diag.message_primary or str(cause))
        self.cause = cause


# ---------------------------------------------------------------------------------------------
# Validation (before the transaction)
# ---------------------------------------------------------------------------------------------

def check_id(field: str, value: str) -> None:
    if not value:
        raise Invalid(400 if field in ("X-Tenant-Id", "Idempotency-Key") else 422, f"{field} is empty")
    if len(value.encode("utf-8")) > MAX_ID_BYTES:
        raise Invalid(422, f"{field} is longer than {MAX_ID_BYTES} bytes")


def parse_request(raw: bytes) -> dict:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise Invalid(400, f"body is not JSON: {e.msg if hasattr(e, 'msg') else 'not UTF-8'}") from None
    if not isinstance(doc, dict):
        raise Invalid(422, "body must be a JSON object")
    unknown = sorted(set(doc) - set(REQUEST_FIELDS))
    if unknown:
        raise Invalid(422, f"unknown fields: {', '.join(unknown)}")
    for field in REQUEST_FIELDS:
        if not isinstance(doc.get(field), str):
            raise Invalid(422, f"{field} is required and must be a string")
        if "\x00" in doc[field]:
            raise Invalid(422, f"{field} contains a NUL character")
    check_id("actor_id", doc["actor_id"])
    if len(doc["title"]) > MAX_TITLE_CHARS:
        raise Invalid(422, f"title is longer than {MAX_TITLE_CHARS} characters")
    if len(doc["body"].encode("utf-8")) > MAX_BODY_BYTES:
        raise Invalid(422, f"body is larger than {MAX_BODY_BYTES} bytes")
    if doc["priority"] not in PRIORITIES:
        raise Invalid(422, f"priority must be one of {', '.join(PRIORITIES)}")
    return doc


# ---------------------------------------------------------------------------------------------
# The protocol (docs/PROTOCOL.md §4): one transaction
# ---------------------------------------------------------------------------------------------

def ticket_doc(row) -> dict:
    names = TICKET_COLUMNS.split(", ")
    doc = dict(zip(names, row))
    doc["id"] = str(doc["id"])
    doc["created_at"] = doc["created_at"].isoformat()
    doc["updated_at"] = doc["updated_at"].isoformat()
    return doc


def event_payload(ticket: dict, event_id: str, occurred_at: datetime, event_type: str) -> str:
    return json.dumps(
        {
            "event_id": event_id,
            "ticket_id": ticket["id"],
            "tenant_id": ticket["tenant_id"],
            "version": ticket["version"],
            "trace_context": {},
            "occurred_at": occurred_at.isoformat(),
            "payload": {
                "event_type": event_type,
                "priority": ticket["priority"],
                "status": ticket["status"],
                "title": ticket["title"],
            },
        },
        sort_keys=True,
        separators=(",", ":"),
    )


def decide(conn: psycopg.Connection, tenant: str, receipt, payload_hash: str) -> Reply:
    """Step 2's rule for an existing receipt: same fingerprint replays, another conflicts."""
    stored_hash, ticket_id = receipt
    if stored_hash != payload_hash:
        return problem(409, "Idempotency key reuse",
                       "this Idempotency-Key was already used with a different request body")
    row = conn.execute(
        f"SELECT {TICKET_COLUMNS} FROM tickets WHERE tenant_id = %s AND id = %s", (tenant, ticket_id)
    ).fetchone()
    if row is None:  # the foreign key makes this unreachable; say so loudly if it is not
        return problem(500, "Receipt without ticket", f"receipt points at missing ticket {ticket_id}")
    return Reply(201, ticket_doc(row), {"Idempotent-Replayed": "true"})


def insert_all(conn: psycopg.Connection, tenant: str, key: str, req: dict, payload_hash: str) -> dict:
    now = datetime.now(timezone.utc)
    row = conn.execute(
        "INSERT INTO tickets (id, tenant_id, actor_id, title, body, priority, status, version,"
        " created_at, updated_at) VALUES (%s, %s, %s, %s, %s, %s, 'open', 1, %s, %s)"
        f" RETURNING {TICKET_COLUMNS}",
        (uuid.uuid4(), tenant, req["actor_id"], req["title"], req["body"], req["priority"], now, now),
    ).fetchone()
    ticket = ticket_doc(row)
    event_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload_json, occurred_at)"
        " VALUES (%s, %s, %s, 'ticket.created', %s, %s)",
        (event_id, ticket["id"], tenant, event_payload(ticket, event_id, now, "ticket.created"), now),
    )
    # With the barrier's EXCLUSIVE lock on idempotency_receipts held, requests wait here.
    conn.execute(
        "INSERT INTO idempotency_receipts (tenant_id, idempotency_key, payload_hash, ticket_id, created_at)"
        " VALUES (%s, %s, %s, %s, %s)",
        (tenant, key, payload_hash, ticket["id"], now),
    )
    return ticket


def tagged(reply: Reply, path: str) -> Reply:
    """Say which step decided (X-Decision-Path): receipt-lookup, insert or unique-violation."""
    reply.headers["X-Decision-Path"] = path
    return reply


def create_in_transaction(conn: psycopg.Connection, tenant: str, key: str, req: dict) -> Reply:
    payload_hash = fingerprint(req)
    receipt = conn.execute(SELECT_RECEIPT, (tenant, key)).fetchone()
    if receipt is not None:
        return tagged(decide(conn, tenant, receipt, payload_hash), "receipt-lookup")
    conn.execute("SAVEPOINT create_ticket")
    try:
        ticket = insert_all(conn, tenant, key, req, payload_hash)
    except errors.UniqueViolation as e:
        if e.diag.constraint_name != RECEIPT_CONSTRAINT:
            raise
        # Only the savepoint is undone: the outer transaction stays usable for the re-read.
        conn.execute("ROLLBACK TO SAVEPOINT create_ticket")
        receipt = conn.execute(SELECT_RECEIPT, (tenant, key)).fetchone()
        if receipt is None:
            raise WinnerInvisible(e) from e
        return tagged(decide(conn, tenant, receipt, payload_hash), "unique-violation")
    conn.execute("RELEASE SAVEPOINT create_ticket")
    return tagged(Reply(201, ticket), "insert")


class Service:
    def __init__(self, pool: ConnectionPool, isolation: str, name: str):
        self.pool = pool
        self.isolation = isolation
        self.name = name

    def create_ticket(self, tenant: str, key: str, req: dict) -> Reply:
        level = ISOLATION_LEVELS[self.isolation]
        with self.pool.connection() as conn:
            conn.execute(f"BEGIN ISOLATION LEVEL {level}")
            try:
                reply = create_in_transaction(conn, tenant, key, req)
                if reply.status >= 400:
                    conn.execute("ROLLBACK")  # a conflict wrote nothing; say so explicitly
                else:
                    conn.execute("COMMIT")
                return reply
            except WinnerInvisible as e:
                rollback_quietly(conn)
                return problem(
                    500, "Idempotency winner not visible",
                    "the receipt insert hit the unique constraint but the winning receipt is not"
                    f" visible to this transaction ({level}): {e}",
                    sqlstate=e.cause.sqlstate, constraint=e.cause.diag.constraint_name,
                    isolation=self.isolation,
                )
            except psycopg.Error:
                rollback_quietly(conn)
                raise

    def healthy(self) -> bool:
        with self.pool.connection(timeout=2) as conn:
            return conn.execute("SELECT 1").fetchone() == (1,)


def rollback_quietly(conn: psycopg.Connection) -> None:
    try:
        conn.execute("ROLLBACK")
    except psycopg.Error:
        pass  # the connection is broken; the pool discards it


# ---------------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------------

class Handler(BaseHTTPRequestHandler):
    server_version = "lesson-python/1"
    protocol_version = "HTTP/1.1"
    service: Service  # set on the subclass made in main()

    def log_message(self, fmt, *args):  # request line and status only; never a body
        sys.stderr.write(f"[{self.service.name}] {self.address_string()} {fmt % args}\n")

    def send(self, reply: Reply) -> None:
        data = json.dumps(reply.doc, separators=(",", ":")).encode("utf-8")
        self.send_response(reply.status)
        self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(data)))
        self.send_header("X-Served-By", self.service.name)
        for name, value in reply.headers.items():
            self.send_header(name, value)
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path != "/healthz":
            return self.send(problem(404, "Not found", f"no route GET {self.path}"))
        try:
            ok = self.service.healthy()
        except (psycopg.Error, PoolTimeout) as e:
            return self.send(problem(503, "Database unavailable", type(e).__name__))
        self.send(Reply(200 if ok else 503, {"status": "ok" if ok else "down",
                                             "isolation": self.service.isolation}))

    def do_POST(self):
        if self.path != "/v1/tickets":
            self.discard_body()
            return self.send(problem(404, "Not found", f"no route POST {self.path}"))
        try:
            tenant = self.single_header("X-Tenant-Id")
            key = self.single_header("Idempotency-Key")
            check_id("X-Tenant-Id", tenant)
            check_id("Idempotency-Key", key)
            req = parse_request(self.read_body())
        except Invalid as e:
            titles = {400: "Bad request", 413: "Request too large", 422: "Invalid request"}
            return self.send(problem(e.status, titles.get(e.status, "Invalid"), e.detail))
        try:
            reply = self.service.create_ticket(tenant, key, req)
        except PoolTimeout:
            reply = problem(503, "Database unavailable", "no database connection within the pool timeout")
        except psycopg.Error as e:
            reply = problem(
                500, "Database error", e.diag.message_primary or str(e).splitlines()[0],
                sqlstate=e.sqlstate, isolation=self.service.isolation,
                **({"db_detail": e.diag.message_detail} if e.diag.message_detail else {}),
            )
        self.send(reply)

    def single_header(self, name: str) -> str:
        values = self.headers.get_all(name) or []
        if len(values) != 1:
            self.discard_body()
            raise Invalid(400, f"exactly one {name} header is required (got {len(values)})")
        return values[0].strip()

    def read_body(self) -> bytes:
        length = self.headers.get("Content-Length")
        if length is None or not length.isdigit():
            self.close_connection = True
            raise Invalid(400, "Content-Length is required")
        n = int(length)
        if n > MAX_REQUEST_BYTES:
            self.close_connection = True
            raise Invalid(413, f"request body is larger than {MAX_REQUEST_BYTES} bytes")
        return self.rfile.read(n)

    def discard_body(self) -> None:
        length = self.headers.get("Content-Length", "0")
        if length.isdigit() and int(length) <= MAX_REQUEST_BYTES:
            self.rfile.read(int(length))
        else:
            self.close_connection = True


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--database-url", required=True, help="postgresql://… of the service's database")
    p.add_argument("--isolation", choices=sorted(ISOLATION_LEVELS), default="read-committed")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0 = any free port (see --url-file)")
    p.add_argument("--url-file", help="write the service's base URL here once it listens")
    p.add_argument("--name", default="api", help="shown in logs and the X-Served-By header")
    p.add_argument("--pool-size", type=int, default=8, help="largest number of database connections")
    p.add_argument("--pool-timeout", type=float, default=15.0, help="seconds to wait for a connection")
    args = p.parse_args(argv)

    pool = ConnectionPool(
        args.database_url,
        min_size=1,
        max_size=args.pool_size,
        timeout=args.pool_timeout,
        # Explicit BEGIN/COMMIT below; UTC so a replay prints timestamps exactly as the create did.
        kwargs={"autocommit": True, "options": "-c TimeZone=UTC",
                "application_name": f"lesson-python:{args.name}", "connect_timeout": 5},
        open=False,
        name=args.name,
    )
    pool.open(wait=True, timeout=10)

    handler = type("BoundHandler", (Handler,), {"service": Service(pool, args.isolation, args.name)})
    server = ThreadingHTTPServer((args.host, args.port), handler)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    url = f"http://{host}:{port}"
    if args.url_file:
        with open(args.url_file + ".tmp", "w") as f:
            f.write(url + "\n")
        os.replace(args.url_file + ".tmp", args.url_file)
    print(f"[{args.name}] listening on {url} isolation={args.isolation}", file=sys.stderr, flush=True)
    # SIGTERM (run.sh's cleanup) ends serve_forever like Ctrl-C does, so the pool closes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        pool.close(timeout=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
