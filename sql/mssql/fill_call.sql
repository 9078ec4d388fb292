-- gap-healer, SQL Server: a fill in procedure mode. Same parameters and the
-- same one-row result as fill.sql; the procedure runs WITH EXECUTE AS OWNER.
EXEC __schema__.[gap_healer_fill]
    @start = @P1,
    @end = @P2,
    @stream_name = @P3,
    @message_type = @P4,
    @lock_timeout_ms = @P5,
    @stream_lock_timeout_ms = @P6;
