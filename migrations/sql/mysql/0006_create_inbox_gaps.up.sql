-- Inbox gaps for MariaDB (10.6 or later) and MySQL (8.0 or later): the
-- sequence numbers each consumer's high-water mark skipped over (an event
-- applied after a gap) and that it has not applied since.
--
-- An event below the mark whose number lies in a gap was never applied: it
-- arrived after a later event of its aggregate, and the inbox reports it as
-- late (or applies it, if the consumer's policy says so) rather than as a
-- redelivery. Kept for good, like the marks; one row per gap, whatever its
-- length.
CREATE TABLE IF NOT EXISTS outbox_inbox_gap (
    consumer    VARCHAR(255) NOT NULL,
    topic       VARCHAR(255) NOT NULL,
    aggregateid VARCHAR(255) NOT NULL,
    first_seq   BIGINT       NOT NULL,
    last_seq    BIGINT       NOT NULL,
    PRIMARY KEY (consumer, topic, aggregateid, first_seq)
) ENGINE = InnoDB;
