-- The business table of the glue app (the library keeps its keys in Redis).
CREATE TABLE orders (
    id              bigserial PRIMARY KEY,
    item            text        NOT NULL,
    qty             integer     NOT NULL,
    owner           text,
    idempotency_key text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
