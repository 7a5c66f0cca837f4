-- Day-partitioned outbox (MariaDB 10.6 or later, MySQL 8). Not part of the
-- default migrations: `outbox-relay migrate --partitioned`, or add
-- `outbox_migrations::PartitionOutbox` to your migrator after the others.
--
-- The outbox becomes a table partitioned by RANGE COLUMNS on `created_at`
-- (UTC), one partition per day named `pYYYYMMDD` for today and the next 7
-- days, after a first partition holding every earlier row (`p_before`,
-- the rows of a converted outbox) and before `p_future` (MAXVALUE), which
-- takes rows later than the last day, so that no insert ever fails.
-- `outbox-relay partitions maintain` splits the coming days out of
-- `p_future` and drops past days once every row in them is published
-- (`ALTER TABLE ... DROP PARTITION`: no DELETE, no purge debt). Dropping the
-- first partition leaves the next one as first, which then takes any older
-- row, so an insert with an old creation time never fails either.
--
-- The primary key becomes (id, created_at) and `seq` keeps a plain index,
-- as a partitioned table's unique keys must include the partition key:
-- two rows may share an id only with different creation times. Event ids
-- are UUIDs drawn per event, and consumers deduplicate by id.
--
-- On an existing plain outbox this one ALTER TABLE copies every row into
-- the partitions (writers wait for it): clean up published rows first.
-- Running it again changes nothing.

SET @outbox_partitioned = (
    SELECT COUNT(*) > 0 FROM information_schema.partitions
    WHERE table_schema = DATABASE() AND table_name = 'outbox'
      AND partition_name IS NOT NULL
);
SET @outbox_today = UTC_DATE();
SET @outbox_days = (
    SELECT GROUP_CONCAT(
        CONCAT('PARTITION p', DATE_FORMAT(DATE_ADD(@outbox_today, INTERVAL d DAY), '%Y%m%d'),
               ' VALUES LESS THAN (''',
               DATE_ADD(@outbox_today, INTERVAL d + 1 DAY), ' 00:00:00'')')
        ORDER BY d SEPARATOR ', ')
    FROM (SELECT 0 AS d UNION ALL SELECT 1 UNION ALL SELECT 2 UNION ALL SELECT 3
          UNION ALL SELECT 4 UNION ALL SELECT 5 UNION ALL SELECT 6 UNION ALL SELECT 7) AS days
);
SET @outbox_partition = IF(@outbox_partitioned, 'DO 0', CONCAT(
    'ALTER TABLE outbox DROP PRIMARY KEY, ADD PRIMARY KEY (id, created_at), ',
    'DROP INDEX seq, ADD KEY outbox_seq_idx (seq) ',
    'PARTITION BY RANGE COLUMNS (created_at) (',
    'PARTITION p_before VALUES LESS THAN (''', @outbox_today, ' 00:00:00''), ',
    @outbox_days, ', ',
    'PARTITION p_future VALUES LESS THAN (MAXVALUE))'
));
PREPARE outbox_partition FROM @outbox_partition;
EXECUTE outbox_partition;
DEALLOCATE PREPARE outbox_partition;
