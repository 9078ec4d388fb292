-- The highest committed position, NULL for an empty table (read from the
-- primary key index's end).
SELECT MAX(global_position)::bigint AS head
FROM __schema__.messages;
