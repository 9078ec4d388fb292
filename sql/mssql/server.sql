-- gap-healer, SQL Server: which server this is (MssqlEngine::server).
-- Babelfish for PostgreSQL speaks TDS and T-SQL but is not SQL Server: it
-- has no EXECUTE AS OWNER (so no procedure mode), no dirty reads and its
-- own lock timeout error. @@VERSION names it.
SELECT
    CAST(@@VERSION AS NVARCHAR(400)) AS server_version,
    CAST(DB_NAME() AS NVARCHAR(128)) AS database_name,
    CAST(
        CASE WHEN @@VERSION LIKE N'%Babelfish%' THEN 1 ELSE 0 END AS BIT
    ) AS babelfish;
