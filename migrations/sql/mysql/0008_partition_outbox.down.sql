-- Back to a plain outbox (MariaDB / MySQL): every row is copied into an
-- unpartitioned table (writers wait for it). Running it again changes
-- nothing.

SET @outbox_partitioned = (
    SELECT COUNT(*) > 0 FROM information_schema.partitions
    WHERE table_schema = DATABASE() AND table_name = 'outbox'
      AND partition_name IS NOT NULL
);
SET @outbox_unpartition = IF(@outbox_partitioned, 'ALTER TABLE outbox REMOVE PARTITIONING', 'DO 0');
PREPARE outbox_unpartition FROM @outbox_unpartition;
EXECUTE outbox_unpartition;
DEALLOCATE PREPARE outbox_unpartition;
SET @outbox_keys = IF(@outbox_partitioned,
    'ALTER TABLE outbox DROP PRIMARY KEY, ADD PRIMARY KEY (id), DROP INDEX outbox_seq_idx, ADD UNIQUE KEY seq (seq)',
    'DO 0');
PREPARE outbox_keys FROM @outbox_keys;
EXECUTE outbox_keys;
DEALLOCATE PREPARE outbox_keys;
