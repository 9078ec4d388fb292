-- The highest committed position, NULL for an empty table (read from one
-- end of the primary key index).
SELECT MAX(__position__)::bigint AS head
FROM __table__;
