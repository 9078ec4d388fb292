-- The checkpoints of every store of a pool in one reading
-- (src/engine/postgres/checkpoints.rs): __checkpoints__ is one SELECT per
-- store of its checkpoints table, `SELECT n, id::text, position::bigint FROM
-- <schema>.checkpoints`, joined by UNION ALL, n the store's place in the
-- reading. Sent as one simple query, which PostgreSQL runs as one implicit
-- transaction, so SET LOCAL holds for this reading only: a table locked by
-- DDL fails the reading after the lock timeout (each store then reads its
-- own) instead of holding every store of the pool behind it.
SET LOCAL lock_timeout = '__lock_timeout_ms__ms';
__checkpoints__;
