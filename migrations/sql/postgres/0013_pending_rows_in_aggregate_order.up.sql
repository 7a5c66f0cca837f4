-- Pending rows in every aggregate's order by `seq` (PostgreSQL).
--
-- Appends of earlier versions drew an event's `seq` before they waited for
-- the aggregate's `outbox_sequence` lock, so a writer that waited could
-- insert its later event with a lower `seq` than the event it waited for.
-- Appends now draw `seq` under the lock, and the relay claims by `seq`
-- alone. This gives the pending numbered rows of each aggregate the same
-- `seq` values in `aggregate_seq` order: an aggregate whose rows were
-- inverted trades `seq` values among its own pending rows, every other
-- row keeps its own. Rows without `aggregate_seq` (written by plain SQL)
-- are left as they are.
--
-- Run it with the old writers stopped (or right after they are replaced):
-- a row an old writer inserts afterwards may still be inverted; the relay
-- then sends what one batch holds of the aggregate in `aggregate_seq`
-- order and logs the inversion.
WITH pending AS (
    SELECT id, aggregatetype, aggregateid, seq, aggregate_seq
    FROM outbox
    WHERE published_at IS NULL AND dead_lettered_at IS NULL AND aggregate_seq IS NOT NULL
),
by_number AS (
    SELECT id, aggregatetype, aggregateid,
           row_number() OVER (PARTITION BY aggregatetype, aggregateid ORDER BY aggregate_seq, seq) AS place
    FROM pending
),
by_seq AS (
    SELECT seq, aggregatetype, aggregateid,
           row_number() OVER (PARTITION BY aggregatetype, aggregateid ORDER BY seq) AS place
    FROM pending
)
UPDATE outbox SET seq = by_seq.seq
FROM by_number JOIN by_seq USING (aggregatetype, aggregateid, place)
WHERE outbox.id = by_number.id
  AND outbox.seq <> by_seq.seq
  AND outbox.published_at IS NULL AND outbox.dead_lettered_at IS NULL;
