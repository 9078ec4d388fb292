-- The contiguous watermark (watermark_table = "__watermark__"): one row per
-- store, kept by gap-healer. Every position at or below [position] is a
-- committed event or a tombstone, and [position] never decreases, so a
-- reader that adds `AND GlobalPosition <= position` to its
-- `GlobalPosition > @last` query never skips an event that commits late.
IF SCHEMA_ID(N'__watermark_schema__') IS NULL
    EXEC (N'CREATE SCHEMA __watermark_schema__');

IF OBJECT_ID(N'__watermark__', N'U') IS NULL
    CREATE TABLE __watermark__ (
        store NVARCHAR(200) NOT NULL PRIMARY KEY,
        position BIGINT NOT NULL,
        updated_at DATETIME2(3) NOT NULL DEFAULT SYSUTCDATETIME()
    );

GRANT SELECT, INSERT, UPDATE ON OBJECT::__watermark__ TO [gap_healer];
-- And for each reader's user:
-- GRANT SELECT ON OBJECT::__watermark__ TO [app_reader];
