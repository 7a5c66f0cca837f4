-- The relay's settle statement under a generic plan made while the outbox
-- was empty and never analyzed (BENCHMARKS.md, "Problems found", 1): the
-- plan should join the unnested ids to outbox_pkey (Nested Loop, Index Scan),
-- never scan the table.
--   psql "$OUTBOX_TEST_POSTGRES_URL" -X -f benches/sql/settle-plan.sql
-- Works in a schema of its own, dropped at the end.
\set ON_ERROR_STOP 1
DROP SCHEMA IF EXISTS bench_settle_plan CASCADE;
CREATE SCHEMA bench_settle_plan;
SET search_path = bench_settle_plan;
\ir ../../migrations/sql/postgres/0001_create_outbox.up.sql
\ir ../../migrations/sql/postgres/0002_relay_shards.up.sql
SET plan_cache_mode = force_generic_plan;
-- Since 2998063 (outbox-relay/src/source/postgres.rs, mark_published).
PREPARE settle(uuid[]) AS
  UPDATE outbox AS o SET published_at = now()
  FROM unnest($1::uuid[]) AS p(id) WHERE o.id = p.id;
INSERT INTO outbox (id, aggregatetype, aggregateid, type, payload)
  SELECT gen_random_uuid(), 'Order', (g % 1000)::text, 'OrderPlaced', '{"a": 1}'
  FROM generate_series(1, 30000) AS g;
SELECT array_agg(id)::text AS first_batch
  FROM (SELECT id FROM outbox ORDER BY seq LIMIT 500) AS s \gset
EXPLAIN (ANALYZE, COSTS OFF) EXECUTE settle(:'first_batch');
RESET search_path;
DROP SCHEMA bench_settle_plan CASCADE;
