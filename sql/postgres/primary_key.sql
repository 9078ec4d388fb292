-- The name of the messages table's primary key: a duplicate key on it means
-- an append committed at the position; on any other constraint, the
-- tombstone stream's Version no longer matches its rows. $1 is the messages
-- table's qualified name.
SELECT conname::text AS name
FROM pg_constraint
WHERE conrelid = TO_REGCLASS($1::text) AND contype = 'p';
