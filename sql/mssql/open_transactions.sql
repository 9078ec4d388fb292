-- The transaction-end proof's question on SQL Server (src/proof.rs): which
-- transactions hold an intent-exclusive (or stronger) lock on Messages. A
-- transaction that inserts into Messages takes IX on the table's object
-- before it draws its identity value and keeps it until it ends (under
-- optimized locking too, which releases row locks early but keeps the
-- object lock and the transaction's own lock), so a position drawn before
-- this reading belongs to a transaction listed here, or to one that has
-- ended. sys.dm_tran_locks needs VIEW SERVER STATE (VIEW SERVER PERFORMANCE
-- STATE from SQL Server 2022; VIEW DATABASE STATE on Azure SQL Database):
-- without it the engine says so and the clustered key argument stands
-- alone (`gap-healer check` says which is in force).
--
-- id: the lock's owner (a transaction id, unique while it runs); the
-- session's program name for the log. The reading's own session is left
-- out. The schema placeholder is replaced by the bracketed, validated
-- schema name.

SELECT
    CAST(N'transaction' AS NVARCHAR(20)) AS kind,
    CAST(l.request_owner_type AS NVARCHAR(60)) + N':'
    + CAST(l.request_owner_id AS NVARCHAR(20)) AS id,
    CAST(l.request_session_id AS BIGINT) AS session_id,
    s.program_name AS application
FROM sys.dm_tran_locks AS l
LEFT JOIN sys.dm_exec_sessions AS s ON l.request_session_id = s.session_id
WHERE
    l.resource_database_id = DB_ID()
    AND l.resource_type = N'OBJECT'
    AND l.resource_associated_entity_id = OBJECT_ID(N'__schema__.[Messages]')
    AND l.request_mode IN (N'IX', N'SIX', N'X', N'BU')
    AND l.request_status = N'GRANT'
    AND l.request_session_id <> @@SPID;
