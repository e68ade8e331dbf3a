-- The receipt's foreign key to its ticket is checked at COMMIT, not per statement, so the
-- `on-conflict` create protocol can claim the key first (INSERT … ON CONFLICT DO NOTHING
-- RETURNING on the receipt) and insert the ticket it points at afterwards, in the same
-- transaction. Invariant unchanged: no committed receipt points at a missing ticket or at
-- another tenant's ticket.
ALTER TABLE idempotency_receipts
    ALTER CONSTRAINT idempotency_receipts_ticket_fkey DEFERRABLE INITIALLY DEFERRED;
