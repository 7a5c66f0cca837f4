SET @outbox_drop_index = (
    SELECT IF(COUNT(*) > 0, 'DROP INDEX outbox_pending_aggregate_idx ON outbox', 'DO 0')
    FROM information_schema.statistics
    WHERE table_schema = DATABASE() AND table_name = 'outbox'
      AND index_name = 'outbox_pending_aggregate_idx'
);
PREPARE outbox_drop_index FROM @outbox_drop_index;
EXECUTE outbox_drop_index;
DEALLOCATE PREPARE outbox_drop_index;
