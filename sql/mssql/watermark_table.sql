-- The contiguous watermark (watermark_table = "__watermark__"): one row per
-- store, kept by gap-healer. Every position at or below [position] is a
-- committed event or a tombstone, and [position] never decreases, so a
-- reader that adds `AND GlobalPosition <= position` to its
-- `GlobalPosition > @last` query never skips an event that commits late.
IF SCHEMA_ID(N'__watermark_schema__') IS NULL
    EXEC (N'CREATE SCHEMA __watermark_schema__');

-- healed_table (database.schema.Messages) is the table the row describes:
-- a row is only ever read or raised by a healer of that table, so two
-- daemons whose stores share a name cannot start from, or raise, each
-- other's watermark (give them distinct store names to publish both).
IF OBJECT_ID(N'__watermark__', N'U') IS NULL
    CREATE TABLE __watermark__ (
        store NVARCHAR(200) NOT NULL PRIMARY KEY,
        position BIGINT NOT NULL,
        updated_at DATETIME2(3) NOT NULL DEFAULT SYSUTCDATETIME(),
        healed_table NVARCHAR(400) NULL
    );

-- A table made by an older gap-healer gets the column; its rows then
-- describe no table until their owner is set (check prints the UPDATE).
IF COL_LENGTH(N'__watermark__', N'healed_table') IS NULL
    ALTER TABLE __watermark__ ADD healed_table NVARCHAR(400) NULL;

GRANT SELECT, INSERT, UPDATE ON OBJECT::__watermark__ TO __healer_role__;
-- And for each reader's user:
-- GRANT SELECT ON OBJECT::__watermark__ TO [app_reader];
