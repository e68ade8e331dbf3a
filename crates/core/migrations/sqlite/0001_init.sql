-- Tickets, their transactional outbox and idempotency receipts (SPEC §2).
-- Timestamps are ISO-8601 UTC text with microseconds; ids are UUID text.
-- Invariant: a receipt and an outbox row always point at a ticket of the SAME tenant.
CREATE TABLE tickets (
    id          TEXT    PRIMARY KEY,
    tenant_id   TEXT    NOT NULL,
    actor_id    TEXT    NOT NULL,
    title       TEXT    NOT NULL,
    body        TEXT    NOT NULL,
    priority    TEXT    NOT NULL CHECK (priority IN ('low', 'normal', 'high', 'urgent')),
    status      TEXT    NOT NULL,
    version     INTEGER NOT NULL CHECK (version >= 1),
    created_at  TEXT    NOT NULL,
    updated_at  TEXT    NOT NULL,
    UNIQUE (tenant_id, id)
);

CREATE TABLE outbox_events (
    id            TEXT PRIMARY KEY,
    aggregate_id  TEXT NOT NULL,
    tenant_id     TEXT NOT NULL,
    event_type    TEXT NOT NULL CHECK (event_type IN ('ticket.created', 'ticket.updated')),
    payload_json  TEXT NOT NULL,
    occurred_at   TEXT NOT NULL,
    FOREIGN KEY (tenant_id, aggregate_id) REFERENCES tickets (tenant_id, id)
);
CREATE INDEX outbox_events_tenant_aggregate_idx ON outbox_events (tenant_id, aggregate_id);

-- The arbiter of every race: the primary key on (tenant_id, idempotency_key).
CREATE TABLE idempotency_receipts (
    tenant_id        TEXT NOT NULL,
    idempotency_key  TEXT NOT NULL,
    payload_hash     TEXT NOT NULL CHECK (length(payload_hash) = 64),
    ticket_id        TEXT NOT NULL,
    created_at       TEXT NOT NULL,
    PRIMARY KEY (tenant_id, idempotency_key),
    FOREIGN KEY (tenant_id, ticket_id) REFERENCES tickets (tenant_id, id)
);
