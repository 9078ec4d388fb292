-- gap-healer, SQL Server: rights for the healer's database user.
--
-- The grantee is the database user of the healer's login, as given to
-- `gap-healer sql --role NAME` ([<healer_role>], to be replaced, without
-- it). Create one with, for example,
--   CREATE LOGIN __healer_role__ WITH PASSWORD = N'...';
--   CREATE USER __healer_role__ FOR LOGIN __healer_role__;
-- or, on Azure SQL Database, CREATE USER __healer_role__ WITH PASSWORD = N'...'
-- in the store's database.

-- Procedure mode (recommended): the login runs the fill procedure above and
-- only reads the tables. No ALTER on any table.
GRANT EXECUTE ON OBJECT::__schema__.[gap_healer_fill] TO __healer_role__;
GRANT SELECT ON OBJECT::__schema__.[Messages] TO __healer_role__;
GRANT SELECT ON OBJECT::__schema__.[Streams] TO __healer_role__;

-- Checkpoints is optional (subscriptions may keep checkpoints elsewhere); the
-- grant runs only when the table exists. `--start-from checkpoints` reads it.
IF OBJECT_ID(N'__schema__.[Checkpoints]', N'U') IS NOT NULL
    EXEC (N'GRANT SELECT ON OBJECT::__schema__.[Checkpoints] TO __healer_role__;');

-- Direct mode instead (no procedure): SET IDENTITY_INSERT needs ALTER on
-- Messages, so the login itself gets
--   GRANT SELECT, INSERT, ALTER ON OBJECT::__schema__.[Messages] TO __healer_role__;
--   GRANT SELECT, INSERT, UPDATE ON OBJECT::__schema__.[Streams] TO __healer_role__;
--   GRANT SELECT ON OBJECT::__schema__.[Checkpoints] TO __healer_role__;
-- `gap-healer check` reports which mode a login can use and what is missing.

-- The transaction-end proof reads sys.dm_tran_locks (which transactions
-- hold Messages open for writing); without the right `gap-healer check`
-- says only the clustered key argument is in force. A server-level right
-- of the LOGIN, granted in master:
--   GRANT VIEW SERVER STATE TO __healer_role__;
-- (VIEW SERVER PERFORMANCE STATE is enough from SQL Server 2022.) On Azure
-- SQL Database, in the store's database instead:
--   GRANT VIEW DATABASE STATE TO __healer_role__;
