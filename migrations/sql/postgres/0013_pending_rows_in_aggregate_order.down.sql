-- Nothing to undo: the rows keep the order they were renumbered in, which
-- earlier relays read as well.
SELECT 1;
