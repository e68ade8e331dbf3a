"""A small order service on PostgreSQL for the interposer's cancel test: it speaks the
PostgreSQL v3 protocol itself (startup, trust authentication, simple Query) and keeps a pool of
two connections, opened at startup. A create is one transaction:

    BEGIN
    INSERT INTO pgx_receipts (key, fingerprint, order_id, answer) ... ON CONFLICT DO NOTHING
        RETURNING order_id
    INSERT INTO pgx_orders (id, idempotency_key, ...)     -- only when the receipt was inserted
    (or SELECT the stored receipt, when another request holds the key)
    COMMIT

answered 201 with the order; the same key and body again is 201 with the stored answer and
`Idempotent-Replayed: true`; the key with another body is 422.

A lost connection is handled as pgx handles it: when a statement's connection is lost (end of
stream or reset while waiting for the reply, e.g. cut after its COMMIT), the service opens a
new TCP connection to the same address, sends a CancelRequest with the lost session's process
id and secret key, and reads that connection until the other side closes it (at most
PG_STUB_CANCEL_WAIT_MS, default 15000, pgx's wait). Then it opens a fresh pooled connection
and retries the create: first it reads whether its key's receipt committed (a COMMIT whose
reply was lost may have committed), and answers from it (created when the receipt is its own
order, replayed when another request's); only when nothing committed does it run the
transaction again.

PG_STUB_CANCEL_ADDR=HOST:PORT sends the cancel there instead (a test's listener that never
closes the connection: the wait then lasts its whole timeout).

Standard library only. Usage: pg_cancel_stub.py PORT DATABASE_URL
"""
import hashlib
import json
import os
import queue
import socket
import struct
import sys
import uuid
from http.server import ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

from stub_common import JsonHandler

PORT = int(sys.argv[1])
URL = urlsplit(sys.argv[2])
HOST = URL.hostname or "127.0.0.1"
PG_PORT = URL.port or 5432
USER = unquote(URL.username or "postgres")
DATABASE = unquote(URL.path.lstrip("/")) or USER
CANCEL_ADDR = os.environ.get("PG_STUB_CANCEL_ADDR")
CANCEL_WAIT_S = int(os.environ.get("PG_STUB_CANCEL_WAIT_MS", "15000")) / 1000.0
CANCEL_REQUEST_CODE = 80877102
PROTOCOL_3 = 196608
POOL_SIZE = 2


class Lost(Exception):
    """The connection to the server was lost while a reply was owed."""


class PgError(Exception):
    """An ErrorResponse: its SQLSTATE and message."""

    def __init__(self, fields):
        self.code = fields.get("C", "?????")
        super().__init__("%s %s" % (self.code, fields.get("M", "")))


def literal(value):
    """A string literal (standard_conforming_strings, PostgreSQL's default since 9.1)."""
    if "\0" in value:
        raise ValueError("a NUL byte in a literal")
    return "'" + value.replace("'", "''") + "'"


class Conn:
    """One session: the startup message, trust authentication, BackendKeyData, simple Query."""

    def __init__(self):
        self.sock = socket.create_connection((HOST, PG_PORT), timeout=30)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.f = self.sock.makefile("rb")
        self.pid = self.secret = None
        params = b"user\0%s\0database\0%s\0\0" % (USER.encode(), DATABASE.encode())
        self.sock.sendall(struct.pack("!ii", 8 + len(params), PROTOCOL_3) + params)
        while True:
            kind, body = self.message()
            if kind == b"R":
                (auth,) = struct.unpack("!i", body[:4])
                if auth != 0:
                    raise RuntimeError("authentication method %d: only trust is spoken" % auth)
            elif kind == b"K":
                self.pid, self.secret = struct.unpack("!ii", body[:8])
            elif kind == b"E":
                raise PgError(error_fields(body))
            elif kind == b"Z":
                return
            # ParameterStatus, NoticeResponse: nothing to keep.

    def message(self):
        """One backend message: (type byte, body). Raises Lost at the end of the stream."""
        try:
            head = self.f.read(5)
            if len(head) < 5:
                raise Lost("connection lost (end of stream)")
            kind, length = head[:1], struct.unpack("!i", head[1:])[0]
            body = self.f.read(length - 4)
            if len(body) < length - 4:
                raise Lost("connection lost (end of stream)")
            return kind, body
        except OSError as e:
            raise Lost("connection lost (%s)" % e) from e

    def query(self, sql):
        """Runs one simple Query: (rows as lists of text or None, the last command tag).
        Raises PgError on an ErrorResponse (after its ReadyForQuery), Lost when the
        connection is gone before the ReadyForQuery."""
        data = sql.encode() + b"\0"
        try:
            self.sock.sendall(b"Q" + struct.pack("!i", 4 + len(data)) + data)
        except OSError as e:
            raise Lost("connection lost (%s)" % e) from e
        rows, tag, error = [], None, None
        while True:
            kind, body = self.message()
            if kind == b"T":
                rows = []
            elif kind == b"D":
                rows.append(data_row(body))
            elif kind == b"C":
                tag = body.rstrip(b"\0").decode()
            elif kind == b"E":
                error = PgError(error_fields(body))
            elif kind == b"Z":
                if error is not None:
                    raise error
                return rows, tag
            # EmptyQueryResponse, NoticeResponse, ParameterStatus: nothing to keep.

    def close(self):
        try:
            self.sock.sendall(b"X\0\0\0\4")
        except OSError:
            pass
        self.sock.close()


def error_fields(body):
    fields = {}
    for part in body.split(b"\0"):
        if part:
            fields[chr(part[0])] = part[1:].decode(errors="replace")
    return fields


def data_row(body):
    (n,) = struct.unpack("!h", body[:2])
    values, at = [], 2
    for _ in range(n):
        (size,) = struct.unpack("!i", body[at:at + 4])
        at += 4
        if size < 0:
            values.append(None)
        else:
            values.append(body[at:at + size].decode())
            at += size
    return values


def cancel(lost):
    """pgx on a lost connection: a CancelRequest for the lost session on a new connection,
    then a wait until the other side closes that connection (bounded)."""
    if lost.pid is None:
        return
    host, port = HOST, PG_PORT
    if CANCEL_ADDR:
        host, _, port = CANCEL_ADDR.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=CANCEL_WAIT_S) as s:
            s.sendall(struct.pack("!iiii", 16, CANCEL_REQUEST_CODE, lost.pid, lost.secret))
            s.settimeout(CANCEL_WAIT_S)
            while s.recv(64):
                pass
    except OSError:
        pass  # pgx gives up on the cancel after its wait and goes on


POOL = queue.Queue()


def fingerprint(body):
    return hashlib.sha256(
        json.dumps(body, sort_keys=True, separators=(",", ":")).encode()
    ).hexdigest()


def stored(conn, key):
    rows, _ = conn.query(
        "SELECT order_id, fingerprint, answer FROM pgx_receipts WHERE key = %s" % literal(key)
    )
    return rows[0] if rows else None


def decide(row, order_id, fp):
    """The answer to a request for order `order_id` with fingerprint `fp`, from its key's
    committed receipt `row`: (status, body, headers)."""
    receipt_order, receipt_fp, answer = row
    if receipt_fp != fp:
        return 422, {"error": "the key was used with another body"}, []
    if receipt_order == order_id:
        return 201, json.loads(answer), []
    return 201, json.loads(answer), [("Idempotent-Replayed", "true")]


def transaction(conn, key, fp, order_id, body):
    answer = {"id": order_id, "item": body.get("item"), "quantity": body.get("quantity")}
    conn.query("BEGIN")
    rows, _ = conn.query(
        "INSERT INTO pgx_receipts (key, fingerprint, order_id, answer) VALUES (%s, %s, %s, %s) "
        "ON CONFLICT DO NOTHING RETURNING order_id"
        % (literal(key), literal(fp), literal(order_id), literal(json.dumps(answer)))
    )
    if rows:
        conn.query(
            "INSERT INTO pgx_orders (id, idempotency_key, item, quantity) VALUES (%s, %s, %s, %s)"
            % (literal(order_id), literal(key), literal(str(answer["item"])),
               literal(str(answer["quantity"])))
        )
        result = 201, answer, []
    else:
        # Another request's receipt committed (ON CONFLICT waited for it): its answer.
        result = decide(stored(conn, key), order_id, fp)
    conn.query("COMMIT")
    return result


def checkout():
    """A pooled connection (a slot whose connection was lost is opened again)."""
    conn = POOL.get()
    if conn is None:
        try:
            conn = Conn()
        except Exception:
            POOL.put(None)
            raise
    return conn


def create(key, body):
    """The create, retried once after a lost connection: (status, body, headers)."""
    fp = fingerprint(body)
    order_id = str(uuid.uuid4())
    conn = checkout()
    try:
        try:
            return transaction(conn, key, fp, order_id, body)
        except Lost:
            lost, conn = conn, None
            lost.sock.close()
            cancel(lost)
            conn = Conn()
            # A COMMIT whose reply was lost may have committed: read first.
            row = stored(conn, key)
            if row is not None:
                return decide(row, order_id, fp)
            return transaction(conn, key, fp, order_id, body)
    except Lost:
        if conn is not None:
            conn.sock.close()
        conn = None
        raise
    except PgError:
        try:
            conn.query("ROLLBACK")
        except Lost:
            conn.sock.close()
            conn = None
        raise
    finally:
        POOL.put(conn)


class Handler(JsonHandler):
    def do_POST(self):
        raw = self.rfile.read(int(self.headers.get("Content-Length", "0")))
        key = self.headers.get("Idempotency-Key")
        try:
            body = json.loads(raw)
        except ValueError:
            return self.answer(400, {"error": "the body is not JSON"})
        if not key or not isinstance(body, dict):
            return self.answer(400, {"error": "an Idempotency-Key and a JSON object are needed"})
        try:
            status, answer, headers = create(key, body)
        except (Lost, PgError, OSError, RuntimeError) as e:
            return self.answer(503, {"error": str(e)})
        self.answer(status, answer, headers)


def main():
    setup = Conn()
    setup.query(
        "CREATE TABLE IF NOT EXISTS pgx_receipts (key text PRIMARY KEY, fingerprint text NOT NULL,"
        " order_id text NOT NULL, answer text NOT NULL)"
    )
    setup.query(
        "CREATE TABLE IF NOT EXISTS pgx_orders (id text PRIMARY KEY,"
        " idempotency_key text NOT NULL, item text, quantity text)"
    )
    POOL.put(setup)
    for _ in range(POOL_SIZE - 1):
        POOL.put(Conn())
    ThreadingHTTPServer(("127.0.0.1", PORT), Handler).serve_forever()


main()
