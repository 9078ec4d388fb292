-- The heads of every store of a pool that polls at the same moment, in one
-- reading (src/engine/postgres/heads.rs): __heads__ is one
-- shared_head.sql per store, in the order of n. Sent as one simple query,
-- which PostgreSQL runs as one implicit transaction, so SET LOCAL holds for
-- this reading only: a table locked by DDL fails the reading after the lock
-- timeout (each store then scans on its own) instead of holding every store
-- of the pool behind it.
SET LOCAL lock_timeout = '__lock_timeout_ms__ms';
SELECT
    t.n,
    t.h
FROM UNNEST(ARRAY[__heads__]::bigint []) WITH ORDINALITY AS t (h, n);
