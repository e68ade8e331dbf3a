-- Baseline of `ticketflow bench` (PostgreSQL, replay and hot-key): the statements either
-- protocol sends to replay an existing receipt (lookup, then the ticket as it is now), run by
-- pgbench -n -M prepared. -D tag=KEY_PREFIX -D tenant=TENANT -D nkeys=N: keys tag || 0..N-1,
-- created beforehand.
\set i random(0, :nkeys - 1)
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT tenant_id, idempotency_key, payload_hash, ticket_id, created_at FROM idempotency_receipts WHERE tenant_id = :tenant AND idempotency_key = :tag::text || :i::text \gset
SELECT id, tenant_id, actor_id, title, body, priority, status, version, created_at, updated_at FROM tickets WHERE tenant_id = :tenant AND id = :ticket_id::uuid;
COMMIT;
