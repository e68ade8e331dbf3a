-- Baseline of `ticketflow bench` (PostgreSQL, create, on-conflict protocol): the statements
-- the protocol sends for a fresh key, in the same order, run by pgbench -n -M prepared.
-- -D tag=RUN_PREFIX -D tenant=TENANT; keys are tag || random 63-bit number (distinct).
-- Ids are derived from the key on the server (md5(...)::uuid) instead of sent by the client.
\set k random(1, 9000000000000000000)
BEGIN ISOLATION LEVEL READ COMMITTED;
SELECT tenant_id, idempotency_key, payload_hash, ticket_id, created_at FROM idempotency_receipts WHERE tenant_id = :tenant AND idempotency_key = :tag::text || :k::text;
INSERT INTO idempotency_receipts (tenant_id, idempotency_key, payload_hash, ticket_id, created_at) VALUES (:tenant, :tag::text || :k::text, '2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881', md5(:tag::text || :k::text)::uuid, now()) ON CONFLICT (tenant_id, idempotency_key) DO NOTHING RETURNING 1;
INSERT INTO tickets (id, tenant_id, actor_id, title, body, priority, status, version, created_at, updated_at) VALUES (md5(:tag::text || :k::text)::uuid, :tenant, 'u1', 'Printer jammed', 'Floor 3 printer shows E-42', 'high', 'open', 1, now(), now());
INSERT INTO outbox_events (id, aggregate_id, tenant_id, event_type, payload_json, occurred_at) VALUES (md5('e' || :tag::text || :k::text)::uuid, md5(:tag::text || :k::text)::uuid, :tenant, 'ticket.created', '{"event_id":"00000000-0000-4000-8000-000000000000","occurred_at":"2026-11-29T22:00:00.000000+00:00","payload":{"event_type":"ticket.created","priority":"high","status":"open","title":"Printer jammed"},"tenant_id":"bench","ticket_id":"00000000-0000-4000-8000-000000000000","trace_context":{},"version":1}', now());
COMMIT;
