-- The business table of the glue app (the library's key table is made by `createcachetable`).
CREATE TABLE orders (
    id              bigserial PRIMARY KEY,
    item            text        NOT NULL,
    qty             integer     NOT NULL,
    owner           text,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
