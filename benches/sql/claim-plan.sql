-- The relay's claim statement (`claim_sql` in
-- outbox-relay/src/source/postgres.rs, sharded form, as `outbox-relay run`
-- issues it) on a backlog loaded by SQL, before and after ANALYZE, with
-- EXPLAIN (ANALYZE, BUFFERS), and a proposed form of it whose plan does not
-- depend on statistics. Run from the repository's root:
--
--   psql postgres://postgres@127.0.0.1:5432/test -X -f benches/sql/claim-plan.sql \
--     [-v events=200000] [-v aggregates=2000] [-v shards='{0,1,2,3,4,5}']
--
-- `shards` is the claiming relay's share of the 16 default shards (the
-- first third: one of three relays). Works in schema outbox_claim_plan,
-- dropped at the end; every EXPLAIN runs in a transaction rolled back, so
-- the claim's row locks and the loaded rows' state do not carry over.
\set ON_ERROR_STOP on
\if :{?events} \else \set events 200000 \endif
\if :{?aggregates} \else \set aggregates 2000 \endif
\if :{?shards} \else \set shards '{0,1,2,3,4,5}' \endif
DROP SCHEMA IF EXISTS outbox_claim_plan CASCADE;
CREATE SCHEMA outbox_claim_plan;
SET search_path = outbox_claim_plan;
SET client_min_messages = warning;
\i migrations/sql/postgres/0001_create_outbox.up.sql
\i migrations/sql/postgres/0005_claim_in_aggregate_order.up.sql
ALTER TABLE outbox SET (autovacuum_enabled = false, toast.autovacuum_enabled = false);
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload, aggregate_seq)
SELECT gen_random_uuid(), 'Order', (n % :aggregates)::text, 'OrderPlaced',
       jsonb_build_object('order_id', n, 'customer', 'c-' || (n % 977), 'total_cents', 1000 + n % 9973, 'currency', 'EUR'),
       n / :aggregates + 1
FROM generate_series(0, :events - 1) AS n ORDER BY n;

PREPARE claim(bigint, text[], text[], bigint, bigint[]) AS
WITH head AS (SELECT aggregatetype, aggregateid, min(seq) AS first_seq, count(*) AS n FROM (SELECT aggregatetype, aggregateid, seq FROM outbox WHERE outbox.published_at IS NULL AND outbox.dead_lettered_at IS NULL AND (aggregatetype, aggregateid) NOT IN (SELECT t, i FROM unnest($2::text[], $3::text[]) AS excluded(t, i)) AND ((hashtextextended(aggregatetype || '/' || aggregateid, 0) % $4) + $4) % $4 = ANY($5::bigint[]) ORDER BY seq LIMIT $1) AS oldest GROUP BY aggregatetype, aggregateid), chosen AS (SELECT run.id, head.first_seq, run.run_position FROM head CROSS JOIN LATERAL (SELECT later.id, row_number() OVER (ORDER BY later.aggregate_seq NULLS FIRST, later.seq) AS run_position FROM outbox AS later WHERE later.aggregatetype = head.aggregatetype AND later.aggregateid = head.aggregateid AND later.published_at IS NULL AND later.dead_lettered_at IS NULL ORDER BY later.aggregate_seq NULLS FIRST, later.seq LIMIT head.n) AS run), claimed AS (SELECT id, aggregatetype, aggregateid, type, payload::text AS payload, event_version, aggregate_seq, traceparent, seq, attempts, CASE WHEN isfinite(created_at) THEN EXTRACT(EPOCH FROM clock_timestamp() - created_at)::float8 ELSE 0 END AS age_at_claim FROM outbox WHERE outbox.id = ANY(ARRAY(SELECT id FROM chosen)) AND outbox.published_at IS NULL AND outbox.dead_lettered_at IS NULL FOR UPDATE) SELECT claimed.id::text AS id, aggregatetype, aggregateid, type, payload, event_version, aggregate_seq, traceparent, seq, attempts, age_at_claim, chosen.run_position FROM claimed JOIN chosen ON claimed.id = chosen.id ORDER BY chosen.first_seq, chosen.run_position;

-- Proposed: the same claim with the pending test applied after the lock (to
-- the locked, newest row version) instead of inside the locking scan, so no
-- partial index matches that scan and only outbox_pkey can serve id = ANY(..).
PREPARE claim_proposed(bigint, text[], text[], bigint, bigint[]) AS
WITH head AS (SELECT aggregatetype, aggregateid, min(seq) AS first_seq, count(*) AS n FROM (SELECT aggregatetype, aggregateid, seq FROM outbox WHERE outbox.published_at IS NULL AND outbox.dead_lettered_at IS NULL AND (aggregatetype, aggregateid) NOT IN (SELECT t, i FROM unnest($2::text[], $3::text[]) AS excluded(t, i)) AND ((hashtextextended(aggregatetype || '/' || aggregateid, 0) % $4) + $4) % $4 = ANY($5::bigint[]) ORDER BY seq LIMIT $1) AS oldest GROUP BY aggregatetype, aggregateid), chosen AS (SELECT run.id, head.first_seq, run.run_position FROM head CROSS JOIN LATERAL (SELECT later.id, row_number() OVER (ORDER BY later.aggregate_seq NULLS FIRST, later.seq) AS run_position FROM outbox AS later WHERE later.aggregatetype = head.aggregatetype AND later.aggregateid = head.aggregateid AND later.published_at IS NULL AND later.dead_lettered_at IS NULL ORDER BY later.aggregate_seq NULLS FIRST, later.seq LIMIT head.n) AS run), claimed AS (SELECT id, aggregatetype, aggregateid, type, payload::text AS payload, event_version, aggregate_seq, traceparent, seq, attempts, published_at, dead_lettered_at, CASE WHEN isfinite(created_at) THEN EXTRACT(EPOCH FROM clock_timestamp() - created_at)::float8 ELSE 0 END AS age_at_claim FROM outbox WHERE outbox.id = ANY(ARRAY(SELECT id FROM chosen)) FOR UPDATE) SELECT claimed.id::text AS id, aggregatetype, aggregateid, type, payload, event_version, aggregate_seq, traceparent, seq, attempts, age_at_claim, chosen.run_position FROM claimed JOIN chosen ON claimed.id = chosen.id WHERE claimed.published_at IS NULL AND claimed.dead_lettered_at IS NULL ORDER BY chosen.first_seq, chosen.run_position;

\echo '== never analyzed (reltuples, relpages):'
SELECT reltuples, relpages FROM pg_class WHERE oid = 'outbox'::regclass;
BEGIN;
EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) EXECUTE claim(500, '{}', '{}', 16, :'shards');
ROLLBACK;
\echo '== never analyzed, proposed claim:'
BEGIN;
EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) EXECUTE claim_proposed(500, '{}', '{}', 16, :'shards');
ROLLBACK;
\echo '== after ANALYZE:'
ANALYZE outbox;
BEGIN;
EXPLAIN (ANALYZE, BUFFERS, TIMING OFF) EXECUTE claim(500, '{}', '{}', 16, :'shards');
ROLLBACK;
RESET search_path;
DROP SCHEMA outbox_claim_plan CASCADE;
