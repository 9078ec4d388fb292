
-- The contiguous watermark (watermark_table = "__watermark__"): one row per
-- store, kept by gap-healer. Every position at or below `position` is a
-- committed event or a tombstone, and `position` never decreases, so a
-- reader that adds `AND <position> <= position` to its `<position> > last`
-- query (global_position for Eventuous, position for ledger-core) never
-- skips an event that commits late.
-- `healed_table` (database.schema.table) is the table the row describes:
-- a row is only ever read or raised by a healer of that table, so two
-- daemons whose stores share a name cannot start from, or raise, each
-- other's watermark (give them distinct store names to publish both).
CREATE SCHEMA IF NOT EXISTS __watermark_schema__;
CREATE TABLE IF NOT EXISTS __watermark__ (
    store        text        PRIMARY KEY,
    position     bigint      NOT NULL,
    updated_at   timestamptz NOT NULL DEFAULT now(),
    healed_table text
);
-- A table made by an older gap-healer gets the column; its rows then
-- describe no table until their owner is set (check prints the UPDATE).
ALTER TABLE __watermark__ ADD COLUMN IF NOT EXISTS healed_table text;
GRANT USAGE ON SCHEMA __watermark_schema__ TO __healer_role__;
GRANT SELECT, INSERT, UPDATE ON __watermark__ TO __healer_role__;
-- And for each reader's role:
-- GRANT SELECT ON __watermark__ TO app_reader;
