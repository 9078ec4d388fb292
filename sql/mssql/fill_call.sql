-- gap-healer, SQL Server: a fill in procedure mode. The same one-row result
-- as fill.sql; the procedure runs WITH EXECUTE AS OWNER. Its parameters are
-- fill.sql's but the tombstone stream and type, which are constants of the
-- procedure (fixed by `gap-healer install`), so they are not sent:
--   @P1 NVARCHAR(MAX)  the ranges, 42 characters each (see fill.sql; NULL:
--                      only describe)
--   @P2 INT            lock timeout on message keys, ms
--   @P3 INT            lock timeout on the tombstone stream's row, ms
--   @P4 NVARCHAR(255)  the leader fence, NULL for none (see fill.sql)
EXEC __schema__.[gap_healer_fill]
    @ranges = @P1,
    @lock_timeout_ms = @P2,
    @stream_lock_timeout_ms = @P3,
    @leader_fence = @P4;
