-- Notify only while a relay waits (PostgreSQL).
--
-- A relay about to wait for new rows takes shared advisory locks on the
-- wake-up slots (1869968482, 0) .. (1869968482, 63), then claims once more,
-- and holds them until a claim finds rows. An inserting statement tries the
-- exclusive lock of one slot (its backend's process id modulo 64), held
-- until its transaction ends, and notifies only when the try fails: a
-- relay holds or waits for the slot (or, rarely, a concurrent writer of the
-- same slot holds it). While every relay is busy, or none runs, writers pay
-- no notification; since a relay taking the slots waits for the writers
-- holding them, a row committed after its last claim was notified.
--
-- The relay of the same release takes the slots; a relay that does not
-- is woken by no notification and polls at its interval.

DROP TRIGGER IF EXISTS outbox_notify ON outbox;
CREATE TRIGGER outbox_notify AFTER INSERT ON outbox
    FOR EACH STATEMENT
    WHEN (NOT pg_try_advisory_xact_lock(1869968482, pg_backend_pid() % 64))
    EXECUTE FUNCTION outbox_notify();
