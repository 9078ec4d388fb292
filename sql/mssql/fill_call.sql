-- gap-healer, SQL Server: a fill in procedure mode. The same one-row result
-- as fill.sql; the procedure runs WITH EXECUTE AS OWNER. Its parameters are
-- fill.sql's but the tombstone stream and type, which are constants of the
-- procedure (fixed by `gap-healer install`), so they are not sent:
--   @P1 BIGINT         first position of the range (NULL: only describe)
--   @P2 BIGINT         last position of the range (NULL: only describe)
--   @P3 INT            lock timeout on message keys, ms
--   @P4 INT            lock timeout on the tombstone stream's row, ms
--   @P5 NVARCHAR(255)  the leader fence, NULL for none (see fill.sql)
EXEC __schema__.[gap_healer_fill]
    @start = @P1,
    @end = @P2,
    @lock_timeout_ms = @P3,
    @stream_lock_timeout_ms = @P4,
    @leader_fence = @P5;
