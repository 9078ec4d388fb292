-- gap-healer, SQL Server: rights for the healer's database user.
--
-- [gap_healer] is a placeholder: replace it with the database user of the
-- healer's login (create one with, for example,
--   CREATE LOGIN [gap_healer] WITH PASSWORD = N'...';
--   CREATE USER [gap_healer] FOR LOGIN [gap_healer];
-- or, on Azure SQL Database, CREATE USER [gap_healer] WITH PASSWORD = N'...'
-- in the store's database).

-- Procedure mode (recommended): the login runs the fill procedure above and
-- only reads the tables. No ALTER on any table.
GRANT EXECUTE ON OBJECT::__schema__.[gap_healer_fill] TO [gap_healer];
GRANT SELECT ON OBJECT::__schema__.[Messages] TO [gap_healer];
GRANT SELECT ON OBJECT::__schema__.[Streams] TO [gap_healer];

-- Checkpoints is optional (subscriptions may keep checkpoints elsewhere); the
-- grant runs only when the table exists. `--start-from checkpoints` reads it.
IF OBJECT_ID(N'__schema__.[Checkpoints]', N'U') IS NOT NULL
    EXEC (N'GRANT SELECT ON OBJECT::__schema__.[Checkpoints] TO [gap_healer];');

-- Direct mode instead (no procedure): SET IDENTITY_INSERT needs ALTER on
-- Messages, so the login itself gets
--   GRANT SELECT, INSERT, ALTER ON OBJECT::__schema__.[Messages] TO [gap_healer];
--   GRANT SELECT, INSERT, UPDATE ON OBJECT::__schema__.[Streams] TO [gap_healer];
--   GRANT SELECT ON OBJECT::__schema__.[Checkpoints] TO [gap_healer];
-- `gap-healer check` reports which mode a login can use and what is missing.
