-- Schema of the lesson-python example target (docs/PROTOCOL.md §3). Applied by run.sh to a
-- fresh scratch database; never to a database that holds anything else.
-- Invariant: the arbiter of every race is the primary key of idempotency_receipts on
-- (tenant_id, idempotency_key); the same key in two tenants is two independent intents.

CREATE TABLE tickets (
    id          uuid        PRIMARY KEY,
    tenant_id   text        NOT NULL,
    actor_id    text        NOT NULL,
    title       text        NOT NULL,
    body        text        NOT NULL,
    priority    text        NOT NULL CHECK (priority IN ('low', 'normal', 'high', 'urgent')),
    status      text        NOT NULL DEFAULT 'open',
    version     integer     NOT NULL DEFAULT 1 CHECK (version >= 1),
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);
CREATE INDEX tickets_tenant_idx ON tickets (tenant_id);

CREATE TABLE outbox_events (
    id            uuid        PRIMARY KEY,
    aggregate_id  uuid        NOT NULL REFERENCES tickets (id),
    tenant_id     text        NOT NULL,
    event_type    text        NOT NULL CHECK (event_type IN ('ticket.created', 'ticket.updated')),
    payload_json  text        NOT NULL,
    occurred_at   timestamptz NOT NULL
);
CREATE INDEX outbox_events_tenant_idx ON outbox_events (tenant_id, event_type);

-- Stores the fingerprint (payload_hash), never the request body.
CREATE TABLE idempotency_receipts (
    tenant_id        text        NOT NULL,
    idempotency_key  text        NOT NULL,
    payload_hash     char(64)    NOT NULL,
    ticket_id        uuid        NOT NULL REFERENCES tickets (id),
    created_at       timestamptz NOT NULL,
    PRIMARY KEY (tenant_id, idempotency_key)
);
