-- gap-healer, SQL Server: the state of a pooled session, for tests and
-- diagnostics (MssqlEngine::session_state). A connection handed back to the
-- pool must have no open transaction and no table with IDENTITY_INSERT on.
--
-- There is no function that tells whether IDENTITY_INSERT is on. But only one
-- table per session can have it on, so switching it on for a private
-- temporary table fails (error 8107) exactly when another table still has it.

DECLARE @identity_insert_free BIT = 1;

CREATE TABLE #gap_healer_identity_probe (id INT IDENTITY (1, 1) NOT NULL);

BEGIN TRY
    SET IDENTITY_INSERT #gap_healer_identity_probe ON;
    SET IDENTITY_INSERT #gap_healer_identity_probe OFF;
END TRY
BEGIN CATCH
    SET @identity_insert_free = 0;
END CATCH;

DROP TABLE #gap_healer_identity_probe;

-- session_id numbers are reused once a session ends; with login_time they
-- name one connection. Every login may read its own row of this view.
SELECT
    @@SPID AS session_id,
    (
        SELECT CONVERT(NVARCHAR(30), s.login_time, 126)
        FROM sys.dm_exec_sessions AS s
        WHERE s.session_id = @@SPID
    ) AS login_time,
    @@TRANCOUNT AS open_transactions,
    @@LOCK_TIMEOUT AS lock_timeout_ms,
    @identity_insert_free AS identity_insert_free;
