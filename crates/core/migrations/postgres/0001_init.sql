-- Tickets, their transactional outbox and idempotency receipts (SPEC §2).
-- Invariant: a receipt and an outbox row always point at a ticket of the SAME tenant
-- (composite foreign keys on (tenant_id, id)).
CREATE TABLE tickets (
    id          uuid        PRIMARY KEY,
    tenant_id   text        NOT NULL,
    actor_id    text        NOT NULL,
    title       text        NOT NULL,
    body        text        NOT NULL,
    priority    text        NOT NULL CHECK (priority IN ('low', 'normal', 'high', 'urgent')),
    status      text        NOT NULL,
    version     bigint      NOT NULL CHECK (version >= 1),
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    CONSTRAINT tickets_tenant_id_id_key UNIQUE (tenant_id, id)
);

CREATE TABLE outbox_events (
    id            uuid        PRIMARY KEY,
    aggregate_id  uuid        NOT NULL,
    tenant_id     text        NOT NULL,
    event_type    text        NOT NULL CHECK (event_type IN ('ticket.created', 'ticket.updated')),
    payload_json  text        NOT NULL,
    occurred_at   timestamptz NOT NULL,
    CONSTRAINT outbox_events_ticket_fkey FOREIGN KEY (tenant_id, aggregate_id)
        REFERENCES tickets (tenant_id, id)
);
CREATE INDEX outbox_events_tenant_aggregate_idx ON outbox_events (tenant_id, aggregate_id);

-- The arbiter of every race: the primary key on (tenant_id, idempotency_key).
CREATE TABLE idempotency_receipts (
    tenant_id        text        NOT NULL,
    idempotency_key  text        NOT NULL,
    payload_hash     text        NOT NULL CHECK (length(payload_hash) = 64),
    ticket_id        uuid        NOT NULL,
    created_at       timestamptz NOT NULL,
    CONSTRAINT idempotency_receipts_pkey PRIMARY KEY (tenant_id, idempotency_key),
    CONSTRAINT idempotency_receipts_ticket_fkey FOREIGN KEY (tenant_id, ticket_id)
        REFERENCES tickets (tenant_id, id)
);
